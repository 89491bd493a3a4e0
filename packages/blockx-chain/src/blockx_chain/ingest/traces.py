"""A block's call frames, from either of the two methods nodes offer, as one set of
``traces`` rows.

* ``debug_traceBlockByNumber(n, {"tracer": "callTracer"})`` (geth, reth, anvil,
  Erigon): one call tree per transaction, each frame with its ``calls``.
* ``trace_block(n)`` (OpenEthereum's, served by Erigon, Nethermind, reth, anvil):
  every frame of the block as a flat list, each with its ``traceAddress``.

The node's method is chosen once per run (``choose_method``): the call tracer,
or ``trace_block`` on a node that lacks it. Rows take the call tracer's form, and
``trace_block``'s frames are mapped onto it:

* ``type``: ``call`` frames take their ``callType``; ``create`` frames are
  ``create2`` when ``creationMethod`` says so, else ``create``; ``suicide`` is
  ``selfdestruct``.
* a selfdestruct moves ``action.balance`` from ``action.address`` to
  ``action.refundAddress``, with gas 0, gas used 0, input and output ``0x`` (as the
  call tracer has it).
* a creation's ``to_address`` is the new contract (``result.address``); a failed
  creation made none, so its ``to_address`` is NULL whichever method (the call
  tracer names the address it would have had).
* ``error``: ``ERRORS`` maps OpenEthereum's words onto the call tracer's
  ("Reverted" is "execution reverted"); other words are kept as the node gave them.
* a frame without output has output ``0x`` (the call tracer leaves it out; a
  failed frame of ``trace_block`` has no ``result``).
* the transaction's own frame (``trace_index`` 0): ``gas`` is the transaction's gas
  limit and ``gas_used`` the receipt's ``gasUsed``, intrinsic gas included, as
  geth's call tracer reports them. ``trace_block`` gives the gas left after the
  intrinsic gas and the execution's gas alone; anvil's call tracer gives the same
  gas as ``trace_block`` and the block's cumulative gas used so far: neither is kept.

Every answer is checked against the block asked for: the call tracer's list holds
one result per transaction of the block, in order, each naming its transaction
(``txHash``); ``trace_block``'s frames name the block, their transactions, in
order, and their positions in each call tree (``traceAddress`` against the
parents' ``subtraces``). Frames are at most ``MAX_DEPTH`` deep and at most
``MAX_FRAMES`` a block. Anything else is BAD_ANSWER, one line naming it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from blockx_chain.rpc import EthRpc, RpcError, RpcErrorKind, quantity
from blockx_chain.rpc.answers import (
    MAX_BLOCK_NUMBER,
    a_list,
    an_object,
    bad_answer,
    field,
    hash_value,
    parse_quantity,
    shown,
)
from blockx_chain.rpc.errors import is_method_missing
from blockx_chain.schema import Trace

# The EVM's call depth limit: no frame lies deeper.
MAX_DEPTH: Final = 1024
# Far more frames than a block's gas can pay for (each costs at least ~100 gas).
MAX_FRAMES: Final = 1_000_000
CALL_TRACER: Final = {"tracer": "callTracer"}


class TraceMethod(enum.StrEnum):
    CALL_TRACER = "debug_traceBlockByNumber"
    TRACE_BLOCK = "trace_block"


# OpenEthereum's error words, as the call tracer says them.
ERRORS: Final = {
    "Reverted": "execution reverted",
    "Out of gas": "out of gas",
    "Bad jump destination": "invalid jump destination",
    "Bad instruction": "invalid opcode",
    "Mutable Call In Static Context": "write protection",
}
_CALL_TYPES: Final = frozenset({"call", "delegatecall", "staticcall", "callcode"})
_FRAME_TYPES: Final = _CALL_TYPES | {"create", "create2", "selfdestruct"}


class TracedTransaction(msgspec.Struct, frozen=True):
    """What a transaction's own frame is checked against and takes from elsewhere."""

    hash: str
    gas: int  # the transaction's gas limit
    gas_used: int  # the receipt's


def params(method: TraceMethod, number: int) -> list[Any]:
    if method is TraceMethod.CALL_TRACER:
        return [quantity(number), CALL_TRACER]
    return [quantity(number)]


async def choose_method(eth: EthRpc, number: int) -> TraceMethod:
    """The call tracer, or ``trace_block`` on a node without it (asked of block
    ``number``). RpcError when the node has neither, or fails otherwise."""
    for method in TraceMethod:
        try:
            await eth.client.request(method.value, params(method, number))
        except RpcError as exc:
            if is_method_missing(exc):
                continue
            raise
        return method
    raise RpcError(
        RpcErrorKind.BAD_REQUEST,
        "the node offers neither debug_traceBlockByNumber (with the call tracer) nor "
        "trace_block: --traces needs one",
    )


def block_traces(
    method: TraceMethod,
    answer: Any,
    number: int,
    block_hash: str,
    transactions: Sequence[TracedTransaction],
) -> list[Trace]:
    """The rows of block ``number``'s frames from ``method``'s answer."""
    what = f"{method.value}({quantity(number)})"
    if method is TraceMethod.CALL_TRACER:
        return _from_call_tracer(answer, what, number, block_hash, transactions)
    return _from_trace_block(answer, what, number, block_hash, transactions)


class OtherBlock(Exception):
    """The frames are of another block with this number: the node reorged between
    two requests of one batch."""


def _from_call_tracer(
    answer: Any,
    what: str,
    number: int,
    block_hash: str,
    transactions: Sequence[TracedTransaction],
) -> list[Trace]:
    results = a_list(answer, what)
    if len(results) != len(transactions):
        raise bad_answer(
            what, f"{len(results)} traces for a block of {len(transactions)} transactions"
        )
    rows: list[Trace] = []
    for index, (item, tx) in enumerate(zip(results, transactions, strict=True)):
        where = f"{what}: [{index}]"
        traced = an_object(item, where)
        named = traced.get("txHash")
        if named is not None and hash_value(named, f"{where}.txHash") != tx.hash:
            raise bad_answer(where, f"the trace of {named.lower()}, not of {tx.hash}")
        if traced.get("result") is None:
            # A node that cannot trace the block (its state pruned, a tracer timeout).
            problem = shown(traced.get("error") or "no result and no error")
            raise bad_answer(where, f"the node gave no trace of {tx.hash}: {problem}")
        # Depth first, in order: a stack, as a call tree may be 1024 frames deep.
        stack: list[tuple[Any, list[int]]] = [(traced["result"], [])]
        first = len(rows)
        while stack:
            frame, address = stack.pop()
            at = f"{where}: frame {address}"
            obj = an_object(frame, at)
            calls = a_list(obj.get("calls") or [], f"{at}.calls")
            _bound(rows, address, at)
            place = _Place(number, block_hash, index, tx.hash, len(rows) - first, address)
            rows.append(_call_frame(obj, at, place, calls))
            stack.extend((call, [*address, i]) for i, call in reversed(list(enumerate(calls))))
        rows[first] = _own_frame(rows[first], tx)
    return rows


class _Place(msgspec.Struct, frozen=True):
    """Where a frame sits: its block, transaction and place in the call tree."""

    number: int
    block_hash: str
    tx_index: int
    tx_hash: str
    trace_index: int
    address: list[int]


def _call_frame(obj: dict[str, Any], at: str, place: _Place, calls: list[Any]) -> Trace:
    kind = _text(field(obj, "type", at), f"{at}.type").lower()
    if kind not in _FRAME_TYPES:
        raise bad_answer(f"{at}.type", f"not a kind of call frame: {shown(obj['type'])}")
    error = _optional_text(obj.get("error"), f"{at}.error")
    to = obj.get("to")
    if kind in ("create", "create2") and error is not None:
        to = None  # no contract was made there
    return Trace(
        block_number=place.number,
        transaction_index=place.tx_index,
        trace_index=place.trace_index,
        trace_address=place.address,
        transaction_hash=place.tx_hash,
        block_hash=place.block_hash,
        type=kind,
        from_address=field(obj, "from", at),
        to_address=to,
        value=_quantity(obj.get("value", "0x0"), f"{at}.value"),
        input=obj.get("input") or "0x",
        output=obj.get("output") or "0x",
        gas=_gas(obj.get("gas"), f"{at}.gas"),
        gas_used=_gas(obj.get("gasUsed"), f"{at}.gasUsed"),
        error=error,
        subtraces=len(calls),
    )


def _from_trace_block(
    answer: Any,
    what: str,
    number: int,
    block_hash: str,
    transactions: Sequence[TracedTransaction],
) -> list[Trace]:
    frames = a_list(answer, what)
    rows: list[Trace] = []
    # The frames still to come below each frame of the transaction under way.
    open_frames: list[tuple[list[int], int, int]] = []  # address, subtraces, children seen
    tx_index = -1
    for position, item in enumerate(frames):
        where = f"{what}: [{position}]"
        frame = an_object(item, where)
        if frame.get("type") == "reward":
            continue  # a block reward belongs to no transaction
        _names_block(frame, where, number, block_hash)
        at_tx = frame.get("transactionPosition")
        if not isinstance(at_tx, int) or isinstance(at_tx, bool):
            raise bad_answer(where, f"transactionPosition is {shown(at_tx)}")
        address = _trace_address(frame.get("traceAddress"), f"{where}.traceAddress")
        if at_tx != tx_index:
            _all_seen(open_frames, where)
            if at_tx != tx_index + 1 or at_tx >= len(transactions):
                raise bad_answer(
                    where,
                    f"a frame of transaction {at_tx} after transaction {tx_index}, "
                    f"in a block of {len(transactions)} transactions",
                )
            tx_index = at_tx
            open_frames = []
        tx = transactions[tx_index]
        named = hash_value(frame.get("transactionHash"), f"{where}.transactionHash")
        if named != tx.hash:
            raise bad_answer(where, f"transactionHash {named}, not {tx.hash}")
        expected = _next_address(open_frames)
        if address != expected:
            raise bad_answer(where, f"traceAddress {address} where {expected} comes next")
        _bound(rows, address, where)
        subtraces = _count(frame.get("subtraces"), f"{where}.subtraces")
        trace_index = 0 if not address else rows[-1].trace_index + 1
        place = _Place(number, block_hash, tx_index, tx.hash, trace_index, address)
        row = _parity_frame(frame, where, place, subtraces)
        rows.append(_own_frame(row, tx) if not address else row)
        open_frames.append((address, subtraces, 0))
    _all_seen(open_frames, what)
    if tx_index != len(transactions) - 1:
        raise bad_answer(
            what, f"frames of {tx_index + 1} of the block's {len(transactions)} transactions"
        )
    return rows


def _parity_frame(frame: dict[str, Any], at: str, place: _Place, subtraces: int) -> Trace:
    kind = frame.get("type")
    action = an_object(field(frame, "action", at), f"{at}.action")
    result = frame.get("result")
    result = {} if result is None else an_object(result, f"{at}.result")
    error = _optional_text(frame.get("error"), f"{at}.error")
    error = ERRORS.get(error, error) if error is not None else None
    match kind:
        case "call":
            call_type = _text(field(action, "callType", f"{at}.action"), f"{at}.action.callType")
            if call_type not in _CALL_TYPES:
                raise bad_answer(f"{at}.action.callType", f"not a kind of call: {shown(call_type)}")
            fields = (call_type, action.get("from"), action.get("to"), action.get("value"))
            data = (action.get("input"), result.get("output"))
            gas = (action.get("gas"), result.get("gasUsed", "0x0"))
        case "create":
            method = action.get("creationMethod", "create")
            if method not in ("create", "create2"):
                raise bad_answer(f"{at}.action.creationMethod", f"unknown: {shown(method)}")
            to = None if error is not None else result.get("address")
            fields = (method, action.get("from"), to, action.get("value"))
            data = (action.get("init"), result.get("code"))
            gas = (action.get("gas"), result.get("gasUsed", "0x0"))
        case "suicide":
            fields = (
                "selfdestruct",
                action.get("address"),
                action.get("refundAddress"),
                action.get("balance"),
            )
            data = (None, None)
            gas = ("0x0", "0x0")
        case _:
            raise bad_answer(f"{at}.type", f"not a kind of trace: {shown(kind)}")
    kind_text, sender, to_address, value = fields
    return Trace(
        block_number=place.number,
        transaction_index=place.tx_index,
        trace_index=place.trace_index,
        trace_address=place.address,
        transaction_hash=place.tx_hash,
        block_hash=place.block_hash,
        type=kind_text,
        from_address=sender if sender is not None else field(action, "from", f"{at}.action"),
        to_address=to_address,
        value=_quantity(value if value is not None else "0x0", f"{at}.action.value"),
        input=data[0] or "0x",
        output=data[1] or "0x",
        gas=_gas(gas[0], f"{at}.action.gas"),
        gas_used=_gas(gas[1], f"{at}.result.gasUsed"),
        error=error,
        subtraces=subtraces,
    )


def _own_frame(row: Trace, tx: TracedTransaction) -> Trace:
    return msgspec.structs.replace(row, gas=tx.gas, gas_used=tx.gas_used)


def _names_block(frame: dict[str, Any], where: str, number: int, block_hash: str) -> None:
    named = frame.get("blockNumber")
    if named is not None:
        # OpenEthereum's blockNumber is a JSON number; some nodes send a quantity.
        at = named if isinstance(named, int) and not isinstance(named, bool) else None
        if at is None:
            at = parse_quantity(named, f"{where}.blockNumber", maximum=MAX_BLOCK_NUMBER)
        if at != number:
            raise bad_answer(where, f"a frame of block {at}, not of block {number}")
    named_hash = frame.get("blockHash")
    if named_hash is not None:
        if not isinstance(named_hash, str):
            raise bad_answer(f"{where}.blockHash", f"not a hash: {shown(named_hash)}")
        if named_hash.lower() != block_hash:
            raise OtherBlock(f"block {number}: its traces are of another block {number}")


def _next_address(open_frames: list[tuple[list[int], int, int]]) -> list[int]:
    """Where the next frame of a depth-first walk sits: the next child of the
    deepest frame still owed children (marking it seen), or a new transaction's
    own frame."""
    while open_frames:
        address, subtraces, seen = open_frames[-1]
        if seen < subtraces:
            open_frames[-1] = (address, subtraces, seen + 1)
            return [*address, seen]
        open_frames.pop()
    return []


def _all_seen(open_frames: list[tuple[list[int], int, int]], where: str) -> None:
    for address, subtraces, seen in open_frames:
        if seen < subtraces:
            raise bad_answer(
                where, f"frame {address} has {subtraces} subtraces, but {seen} followed it"
            )


def _bound(rows: list[Trace], address: list[int], where: str) -> None:
    if len(address) > MAX_DEPTH:
        raise bad_answer(where, f"a frame {len(address)} calls deep, deeper than the EVM allows")
    if len(rows) >= MAX_FRAMES:
        raise bad_answer(where, f"more than {MAX_FRAMES} frames in one block")


def _trace_address(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        raise bad_answer(what, f"not a list of positions: {shown(value)}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise bad_answer(what, f"not text: {shown(value)}")
    return value


def _optional_text(value: Any, what: str) -> str | None:
    return None if value is None or value == "" else _text(value, what)


def _quantity(value: Any, what: str) -> int:
    return parse_quantity(value, what)


def _gas(value: Any, what: str) -> int:
    return parse_quantity(value, what, maximum=MAX_BLOCK_NUMBER)


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FRAMES:
        raise bad_answer(what, f"not a count of frames: {shown(value)}")
    return value
