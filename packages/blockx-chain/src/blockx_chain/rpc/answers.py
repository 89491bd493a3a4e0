"""What a node's answer must be before it is believed: pure checks shared by ingest
(``blockx_chain.ingest``) and the Worker's ``io.rpc``.

A faulty, misconfigured or hostile node may answer another block than the one asked
for, the receipts of another block, a number of four thousand digits, or a string
where an object belongs. Each check returns the answer (or the value read from it)
when it is the one asked for, and otherwise raises ``RpcError(BAD_ANSWER)`` with one
line naming the request, the field, what was asked for and what came back.
BAD_ANSWER is not retryable: the same node gives the same answer.

* ``parse_quantity``: ``0x`` and 1 to 64 hex digits (a uint256 at most), at most
  ``maximum``.
* ``check_block``: a block object; asked by number it has that number, asked by hash
  that hash; its transactions are hashes, or objects when asked in full, each naming
  this block and its own index.
* ``check_receipts``: a block's receipts in order, each naming the block asked for,
  its own index and (when known) the block's transaction at that index; every log
  names its receipt's block and transaction.
* ``check_receipt`` and ``check_transaction``: the transaction asked for.
* ``check_logs``: logs inside the block range (or of the block hash) asked for, of
  the addresses and topics asked for.

``check_answer(method, params, answer)`` picks the check a request's answer gets:
ingest's typed reads and the Worker's ``io.rpc`` both go through it. A method whose
answer names nothing to compare (``eth_call``, ``eth_getCode``, ``eth_feeHistory``)
is checked for its shape only, or not at all; it is bounded like every answer by the
client's size limit and timeout.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Sequence
from typing import Any, Final, TypeGuard

import msgspec

from blockx_chain.rpc.errors import RpcError, RpcErrorKind

UINT256_MAX: Final = 2**256 - 1
# The block database's integers are 63 bits; no chain comes near.
MAX_BLOCK_NUMBER: Final = 2**63 - 1

_QUANTITY: Final = re.compile(r"0x[0-9a-fA-F]{1,64}")
_HASH: Final = re.compile(r"0x[0-9a-fA-F]{64}")
_ADDRESS: Final = re.compile(r"0x[0-9a-fA-F]{40}")
_DATA: Final = re.compile(r"0x(?:[0-9a-fA-F]{2})*")
_TAGS: Final = frozenset({"latest", "pending", "safe", "finalized", "earliest"})
# Methods whose answer is one quantity, and the largest it may be.
_QUANTITY_METHODS: Final = {
    "eth_blockNumber": MAX_BLOCK_NUMBER,
    "eth_chainId": MAX_BLOCK_NUMBER,  # kept in 63 bits too, as every chain's id fits
    "eth_gasPrice": UINT256_MAX,
    "eth_getBalance": UINT256_MAX,
    "eth_getTransactionCount": UINT256_MAX,
    "eth_estimateGas": UINT256_MAX,
}
_DATA_METHODS: Final = frozenset({"eth_call", "eth_getCode", "eth_getStorageAt"})


class ByNumber(msgspec.Struct, frozen=True):
    number: int


class ByHash(msgspec.Struct, frozen=True):
    hash: str  # lowercase


class ByTag(msgspec.Struct, frozen=True):
    """``latest``, ``finalized``, ...: any block may answer; ``pending`` is not yet one."""

    tag: str


BlockAsked = ByNumber | ByHash | ByTag

_shortened = reprlib.Repr()
_shortened.maxstring = 48
_shortened.maxother = 48
_shortened.maxlong = 48
_shortened.maxlist = 3
_shortened.maxdict = 3
_shortened.maxlevel = 2


def shown(value: Any) -> str:
    """``value`` for a one-line message: short, whatever the node sent."""
    text = _shortened.repr(value)
    if isinstance(value, str) and len(value) > _shortened.maxstring:
        text += f" ({len(value)} characters)"
    return text


def call_text(method: str, params: Sequence[Any]) -> str:
    """``eth_getBlockByNumber(0xb, true)``: a request as messages name it."""
    if not params:
        return method
    return f"{method}({', '.join(_param_text(p) for p in params)})"


def _param_text(param: Any) -> str:
    try:
        text = param if isinstance(param, str) else msgspec.json.encode(param).decode()
    except (TypeError, ValueError, OverflowError):
        text = shown(param)
    return text if len(text) <= 160 else text[:160] + "..."


def bad_answer(what: str, problem: str) -> RpcError:
    return RpcError(RpcErrorKind.BAD_ANSWER, f"{what}: {problem}")


def parse_quantity(
    value: Any, what: str = "the node's answer", *, maximum: int = UINT256_MAX
) -> int:
    if not isinstance(value, str) or _QUANTITY.fullmatch(value) is None:
        raise bad_answer(what, f"not a quantity (0x and 1 to 64 hex digits): {shown(value)}")
    number = int(value, 16)
    if number > maximum:
        raise bad_answer(what, f"{value} is above {maximum}")
    return number


def block_number(value: Any, what: str) -> int:
    return parse_quantity(value, what, maximum=MAX_BLOCK_NUMBER)


def hash_value(value: Any, what: str) -> str:
    if not isinstance(value, str) or _HASH.fullmatch(value) is None:
        raise bad_answer(what, f"not a 32-byte hash: {shown(value)}")
    return value.lower()


def an_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_answer(what, f"not an object: {shown(value)}")
    return value


def a_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise bad_answer(what, f"not a list: {shown(value)}")
    return value


def field(obj: dict[str, Any], name: str, what: str) -> Any:
    """``obj[name]``; a missing or null field is a bad answer naming it."""
    value = obj.get(name)
    if value is None:
        raise bad_answer(what, f"{name} is missing")
    return value


def check_block(
    answer: Any, asked: BlockAsked, what: str, *, full: bool | None = None
) -> dict[str, Any]:
    """The block asked for; ``full`` says whether transactions are objects (True),
    hashes (False) or either (None)."""
    block = an_object(answer, what)
    if asked == ByTag("pending"):
        return block
    number = block_number(field(block, "number", what), f"{what}: number")
    block_hash = hash_value(field(block, "hash", what), f"{what}: hash")
    hash_value(field(block, "parentHash", what), f"{what}: parentHash")
    match asked:
        case ByNumber(wanted) if number != wanted:
            raise bad_answer(what, f"the node answered block {number}, not block {wanted}")
        case ByHash(wanted) if block_hash != wanted:
            raise bad_answer(
                what, f"the node answered block {number} {block_hash}, not block {wanted}"
            )
    transactions = a_list(field(block, "transactions", what), f"{what}: transactions")
    for index, tx in enumerate(transactions):
        if full is not False and _transaction_fits(tx, number, block_hash, index):
            continue
        where = f"{what}: transactions[{index}]"
        if isinstance(tx, str) and full is not True:
            hash_value(tx, where)
        elif isinstance(tx, dict) and full is not False:
            hash_value(field(tx, "hash", where), f"{where}.hash")
            _names_block(tx, number, block_hash, where)
            _at_index(tx, index, where)
        else:
            shape = "an object" if full else "a hash"
            raise bad_answer(where, f"not {shape}: {shown(tx)}")
    return block


def check_receipts(
    answer: Any,
    what: str,
    *,
    number: int | None = None,
    block_hash: str | None = None,
    transactions: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """One block's receipts: of block ``number`` / ``block_hash`` when given, of the
    block's ``transactions`` (hashes, in order) when given."""
    receipts = a_list(answer, what)
    if transactions is not None and len(receipts) != len(transactions):
        raise bad_answer(
            what, f"{len(receipts)} receipts for a block of {len(transactions)} transactions"
        )
    for index, item in enumerate(receipts):
        where = f"{what}: [{index}]"
        receipt = an_object(item, where)
        _at_index(receipt, index, where)
        number, block_hash = _receipt_block(receipt, where, number, block_hash)
        if transactions is not None:
            _same_hash(receipt, "transactionHash", transactions[index], where)
    return receipts


def check_receipt(answer: Any, tx_hash: str, what: str) -> dict[str, Any]:
    """The receipt of transaction ``tx_hash``."""
    receipt = an_object(answer, what)
    _same_hash(receipt, "transactionHash", tx_hash, what)
    _receipt_block(receipt, what, None, None)
    return receipt


def check_transaction(answer: Any, tx_hash: str, what: str) -> dict[str, Any]:
    transaction = an_object(answer, what)
    _same_hash(transaction, "hash", tx_hash, what)
    return transaction


class LogFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What an ``eth_getLogs`` asked for; None: not asked (or not checkable)."""

    from_block: int | None = None
    to_block: int | None = None
    block_hash: str | None = None
    addresses: frozenset[str] | None = None
    # Per position: the topics allowed there; None: any.
    topics: tuple[frozenset[str] | None, ...] = ()
    # Up to the pending block: its logs name no block yet.
    pending: bool = False


def log_filter(query: Any) -> LogFilter:
    """The checkable parts of an ``eth_getLogs`` query (the parts it cannot read are
    left unchecked: the node judged them)."""
    if not isinstance(query, dict):
        return LogFilter()
    address = query.get("address")
    addresses = [address] if isinstance(address, str) else address
    topics = query.get("topics")
    return LogFilter(
        from_block=_numeric(query.get("fromBlock")),
        to_block=_numeric(query.get("toBlock")),
        block_hash=query["blockHash"].lower() if _is_hash(query.get("blockHash")) else None,
        addresses=(
            frozenset(a.lower() for a in addresses)
            if isinstance(addresses, list)
            and addresses
            and all(isinstance(a, str) and _ADDRESS.fullmatch(a) for a in addresses)
            else None
        ),
        topics=tuple(_topic_choices(t) for t in topics) if isinstance(topics, list) else (),
        pending=query.get("toBlock") == "pending",
    )


def check_logs(answer: Any, asked: LogFilter, what: str) -> list[dict[str, Any]]:
    logs = a_list(answer, what)
    for index, item in enumerate(logs):
        where = f"{what}: [{index}]"
        log = an_object(item, where)
        if not (asked.pending and log.get("blockNumber") is None):
            _in_blocks(log, asked, where)
        if asked.addresses is not None:
            address = log.get("address")
            if not isinstance(address, str) or address.lower() not in asked.addresses:
                raise bad_answer(where, f"a log of address {shown(address)}, not one asked for")
        topics = log.get("topics")
        topics = topics if isinstance(topics, list) else []
        for position, allowed in enumerate(asked.topics):
            if allowed is None:
                continue
            topic = topics[position] if position < len(topics) else None
            if not isinstance(topic, str) or topic.lower() not in allowed:
                raise bad_answer(where, f"topic {position} is {shown(topic)}, not one asked for")
    return logs


def check_answer(method: str, params: Sequence[Any], answer: Any) -> Any:
    """``answer`` when it is what ``method(params)`` asked for. Whether ``null`` means
    "not found" for a block, receipt or transaction read is the caller's call: give
    those their non-null answers. Parameters it cannot read leave the answer
    unchecked (the node judged them)."""
    what = call_text(method, params)
    first = params[0] if params else None
    if method in _QUANTITY_METHODS:
        parse_quantity(answer, what, maximum=_QUANTITY_METHODS[method])
    elif method in _DATA_METHODS:
        if not isinstance(answer, str) or _DATA.fullmatch(answer) is None:
            raise bad_answer(what, f"not 0x hex of whole bytes: {shown(answer)}")
    elif method in ("eth_getBlockByNumber", "eth_getBlockByHash"):
        asked = block_asked(first)
        full = params[1] if len(params) > 1 and isinstance(params[1], bool) else None
        if asked is not None:
            check_block(answer, asked, what, full=full)
    elif method == "eth_getBlockReceipts":
        match block_asked(first):
            case ByNumber(number):
                check_receipts(answer, what, number=number)
            case ByHash(block_hash):
                check_receipts(answer, what, block_hash=block_hash)
            case ByTag(tag) if tag != "pending":
                check_receipts(answer, what)
    elif method == "eth_getTransactionReceipt" and _is_hash(first):
        check_receipt(answer, first, what)
    elif method == "eth_getTransactionByHash" and _is_hash(first):
        check_transaction(answer, first, what)
    elif method == "eth_getLogs":
        check_logs(answer, log_filter(first), what)
    return answer


def block_asked(param: Any) -> BlockAsked | None:
    """The block a block parameter names: a quantity, a tag, a hash, or an EIP-1898
    object; None when it names none this can read."""
    if isinstance(param, dict):
        if _is_hash(param.get("blockHash")):
            return ByHash(param["blockHash"].lower())
        param = param.get("blockNumber")
    if isinstance(param, str):
        if param in _TAGS:
            return ByTag(param)
        if _is_hash(param):
            return ByHash(param.lower())
        number = _numeric(param)
        if number is not None:
            return ByNumber(number)
    return None


def _in_blocks(log: dict[str, Any], asked: LogFilter, where: str) -> None:
    number = block_number(field(log, "blockNumber", where), f"{where}.blockNumber")
    low = 0 if asked.from_block is None else asked.from_block
    high = MAX_BLOCK_NUMBER if asked.to_block is None else asked.to_block
    if not low <= number <= high:
        raise bad_answer(where, f"a log of block {number}, outside blocks {low}..{high}")
    if asked.block_hash is not None:
        _same_hash(log, "blockHash", asked.block_hash, where)


def _receipt_block(
    receipt: dict[str, Any], where: str, number: int | None, block_hash: str | None
) -> tuple[int, str]:
    """The block a receipt names, which must be ``number`` / ``block_hash`` when
    given; every log of the receipt names that block and the receipt's transaction."""
    named = _well_formed_quantity(receipt.get("blockNumber"))
    if named is None or named > MAX_BLOCK_NUMBER:
        named = block_number(field(receipt, "blockNumber", where), f"{where}.blockNumber")
    if number is not None and named != number:
        raise bad_answer(where, f"a receipt of block {named}, not of block {number}")
    hash_ = receipt.get("blockHash")
    if not (type(hash_) is str and _LOWER_HASH.fullmatch(hash_) is not None):
        hash_ = hash_value(field(receipt, "blockHash", where), f"{where}.blockHash")
    if block_hash is not None and hash_ != block_hash:
        raise bad_answer(where, f"a receipt of block {hash_}, not of block {block_hash}")
    tx_hash = receipt.get("transactionHash")
    if not (type(tx_hash) is str and _LOWER_HASH.fullmatch(tx_hash) is not None):
        tx_hash = hash_value(field(receipt, "transactionHash", where), f"{where}.transactionHash")
    index = _well_formed_quantity(receipt.get("transactionIndex"))
    if index is None:
        index = parse_quantity(
            field(receipt, "transactionIndex", where), f"{where}.transactionIndex"
        )
    logs = a_list(receipt.get("logs", []), f"{where}.logs")
    for position, item in enumerate(logs):
        if _log_fits(item, named, hash_, tx_hash, index):
            continue
        at = f"{where}.logs[{position}]"
        log = an_object(item, at)
        parse_quantity(field(log, "logIndex", at), f"{at}.logIndex")
        _names_block(log, named, hash_, at)
        _same_hash(log, "transactionHash", tx_hash, at)
        _at_index(log, index, at)
    return named, hash_


# The checks below run for every transaction, receipt and log of every block
# ingested: each first tries the common case, a well-formed field equal to what
# it must be, and builds its message only when that fails.


_LOWER_HASH: Final = re.compile(r"0x[0-9a-f]{64}")


def _well_formed_quantity(value: Any) -> int | None:
    if type(value) is str and _QUANTITY.fullmatch(value) is not None:
        return int(value, 16)
    return None


def _quantity_is(value: Any, wanted: int) -> bool:
    return (
        type(value) is str and _QUANTITY.fullmatch(value) is not None and int(value, 16) == wanted
    )


def _hash_is(value: Any, wanted: str) -> bool:
    return value == wanted and _HASH.fullmatch(value) is not None


def _log_fits(item: Any, number: int, block_hash: str, tx_hash: str, index: int) -> bool:
    return (
        type(item) is dict
        and type(log_index := item.get("logIndex")) is str
        and _QUANTITY.fullmatch(log_index) is not None
        and _quantity_is(item.get("blockNumber"), number)
        and _hash_is(item.get("blockHash"), block_hash)
        and _hash_is(item.get("transactionHash"), tx_hash)
        and _quantity_is(item.get("transactionIndex"), index)
    )


def _transaction_fits(tx: Any, number: int, block_hash: str, index: int) -> bool:
    return (
        type(tx) is dict
        and type(tx_hash := tx.get("hash")) is str
        and _HASH.fullmatch(tx_hash) is not None
        and _quantity_is(tx.get("blockNumber"), number)
        and _hash_is(tx.get("blockHash"), block_hash)
        and _quantity_is(tx.get("transactionIndex"), index)
    )


def _names_block(obj: dict[str, Any], number: int, block_hash: str, where: str) -> None:
    if _quantity_is(obj.get("blockNumber"), number) and _hash_is(obj.get("blockHash"), block_hash):
        return
    named = block_number(field(obj, "blockNumber", where), f"{where}.blockNumber")
    if named != number:
        raise bad_answer(where, f"blockNumber {named}, not {number}")
    _same_hash(obj, "blockHash", block_hash, where)


def _at_index(obj: dict[str, Any], index: int, where: str) -> None:
    if _quantity_is(obj.get("transactionIndex"), index):
        return
    at = parse_quantity(field(obj, "transactionIndex", where), f"{where}.transactionIndex")
    if at != index:
        raise bad_answer(where, f"transactionIndex {at}, not {index}")


def _same_hash(obj: dict[str, Any], name: str, wanted: str, where: str) -> None:
    if _hash_is(obj.get(name), wanted):
        return
    value = hash_value(field(obj, name, where), f"{where}.{name}")
    if value != wanted.lower():
        raise bad_answer(where, f"{name} {value}, not {wanted.lower()}")


def _is_hash(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def _numeric(value: Any) -> int | None:
    if isinstance(value, str) and _QUANTITY.fullmatch(value):
        return int(value, 16)
    return None


def _topic_choices(value: Any) -> frozenset[str] | None:
    if _is_hash(value):
        return frozenset({value.lower()})
    if isinstance(value, list) and value and all(_is_hash(t) for t in value):
        return frozenset(t.lower() for t in value)
    return None  # null, [] or something the node judged: any topic
