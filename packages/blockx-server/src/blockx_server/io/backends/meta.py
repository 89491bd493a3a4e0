"""``io.meta``: what a function may know of its chain, its tokens and its code.

Reads (one chain's, like ``io.blockdb`` and ``io.rpc``):

* ``chain(name=None)`` -> ``{"name", "chain_id", "head", "finalized", "epoch",
  "ingested", "log_filter"}`` of the task's chain, or of the chain ``name`` (the
  router sends it there): ``head`` ``{"number", "hash"}`` and ``finalized`` from the
  block database (the node's block number when there is none), ``ingested``
  ``{"from_block", "to_block"}`` the blocks the database holds, ``log_filter`` what
  a selective database holds (``io.blockdb.log_filter()``). Never cached.
* ``token(address, block=None)`` -> ``{"address", "block", "has_code", "name",
  "symbol", "decimals", "total_supply"}`` of an ERC-20 or ERC-721 contract, read
  with ``eth_call`` through the chain's ``rpc`` backend at ``block`` (a number; None
  reads the latest state). A method the contract lacks (the call reverts, or
  answers nothing or something that is not the ABI encoding of its type) is None,
  never an error; an address without code has every field None. ``total_supply``
  is a decimal string (it may exceed 2**64). Pinned at a block at or below the
  finalized height, the answer is cached for good.
* ``code_epoch()`` -> the Function Code View epoch the task pinned at activation
  (its scope supplies it; None outside a task).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import msgspec

from blockx_core.chains import Chain
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.arguments import bind_arguments
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.rpc import RpcBackend
from blockx_server.io.backends.rpc_params import address_param
from blockx_server.io.errors import BackendError
from blockx_server.io.finality import FinalityView

META: Final = "meta"
CHAIN_OP: Final = "chain"
CODE_EPOCH_OP: Final = "code_epoch"

# The four-byte selectors of the token methods read (keccak of the signature).
_SELECTORS: Final = {
    "name": "0x06fdde03",
    "symbol": "0x95d89b41",
    "decimals": "0x313ce567",
    "total_supply": "0x18160ddd",
}
# A name or symbol longer than this is not one a token means to show.
MAX_TEXT_BYTES: Final = 1024
_WORD: Final = 32


def _word(data: bytes, index: int) -> int | None:
    start = index * _WORD
    if len(data) < start + _WORD:
        return None
    return int.from_bytes(data[start : start + _WORD], "big")


def decode_text(data: bytes) -> str | None:
    """An ABI-encoded ``string`` (or the ``bytes32`` some early tokens answer), or
    None when ``data`` is neither."""
    if len(data) == _WORD:
        # bytes32: the text, padded with zero bytes.
        raw = data.rstrip(b"\0")
    else:
        offset = _word(data, 0)
        if offset is None or offset % _WORD or offset + _WORD > len(data):
            return None
        length = _word(data, offset // _WORD)
        if length is None or length > MAX_TEXT_BYTES or offset + _WORD + length > len(data):
            return None
        raw = data[offset + _WORD : offset + _WORD + length]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def decode_uint(data: bytes, bits: int) -> int | None:
    """An ABI-encoded ``uint<bits>`` (one word), or None when ``data`` is not one."""
    if len(data) != _WORD:
        return None
    value = int.from_bytes(data, "big")
    return value if value < 1 << bits else None


def _hex_bytes(answer: Any) -> bytes | None:
    if not isinstance(answer, str) or not answer.startswith("0x") or len(answer) % 2:
        return None
    try:
        return bytes.fromhex(answer[2:])
    except ValueError:
        return None


class _OfChain(Protocol):
    @property
    def chain(self) -> Chain: ...


class MetaBackend:
    name = META
    read_ops = frozenset({CHAIN_OP, "token", CODE_EPOCH_OP})
    write_ops: frozenset[str] = frozenset()

    def __init__(
        self,
        of: _OfChain,
        *,
        blockdb: BlockDbBackend | None,
        rpc: RpcBackend | None,
        finality: FinalityView | None,
    ) -> None:
        # The chain served (``of.chain``: its id may be learnt after start-up).
        self._of = of
        self._blockdb = blockdb
        self._rpc = rpc
        self._finality = finality

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        match op:
            case "chain":
                (name,) = bind_arguments(args, kwargs, "chain(name=None)", (), ("name",))
                if name not in (None, self._of.chain.name):
                    raise ValueError(
                        f"io.meta.chain({name!r}) reached chain {self._of.chain.name!r}"
                    )
                return await self._chain()
            case "token":
                address, block = bind_arguments(
                    args, kwargs, "token(address, block=None)", ("address",), ("block",)
                )
                return await self._token(address, block)
            case "code_epoch":
                (epoch,) = bind_arguments(args, kwargs, "code_epoch()", (), ("epoch",))
                return epoch
        raise BackendError(IoErrorKind.UNKNOWN_OP, op)

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        if op != "token" or finalized is None:
            return False
        try:
            block = bind_arguments(args, kwargs, "", ("address",), ("block",))[1]
        except TypeError:
            return False
        return isinstance(block, int) and not isinstance(block, bool) and 0 <= block <= finalized

    async def _chain(self) -> dict[str, Any]:
        chain = self._of.chain
        answer: dict[str, Any] = {
            "name": chain.name,
            "chain_id": chain.chain_id,
            "head": None,
            "finalized": None,
            "epoch": 0 if self._finality is None else self._finality.epoch,
            "ingested": None,
            "log_filter": None,
        }
        if self._blockdb is not None:
            state = await self._blockdb.chain()
            if state is not None:
                if state.head_number is not None:
                    answer["head"] = {"number": state.head_number, "hash": state.head_hash}
                answer["finalized"] = state.finalized_number
                answer["epoch"] = state.epoch
            answer["ingested"] = await self._blockdb.ingested()
            log_filter = await self._blockdb.serve("log_filter", [], {})
            # As JSON has it (lists), whether the caller decodes it or not.
            answer["log_filter"] = msgspec.json.decode(msgspec.json.encode(log_filter))
        elif self._rpc is not None:
            number = await self._rpc.serve("block_number", [], {})
            answer["head"] = {"number": number, "hash": None}
        return answer

    async def _token(self, address: Any, block: Any) -> dict[str, Any]:
        if self._rpc is None:
            raise BackendError(
                IoErrorKind.UNAVAILABLE,
                f"io.meta.token reads the node, and chain {self._of.chain.name!r} has no "
                "rpc_url (CHAIN_RPC_URL)",
            )
        checked = address_param(address).lower()  # ValueError: BAD_REQUEST
        if block is not None and (
            isinstance(block, bool) or not isinstance(block, int) or block < 0
        ):
            raise ValueError(f"token(address, block=None): block is a block number (got {block!r})")
        at: Any = "latest" if block is None else block
        answer: dict[str, Any] = {"address": checked, "block": block, "has_code": False}
        answer |= dict.fromkeys(_SELECTORS)
        code = _hex_bytes(await self._rpc.serve("code", [checked, at], {}))
        if not code:
            return answer
        answer["has_code"] = True
        for field, selector in _SELECTORS.items():
            data = await self._call(checked, selector, at)
            if data is None:
                continue
            match field:
                case "name" | "symbol":
                    answer[field] = decode_text(data)
                case "decimals":
                    answer[field] = decode_uint(data, 8)
                case "total_supply":
                    supply = decode_uint(data, 256)
                    answer[field] = None if supply is None else str(supply)
        return answer

    async def _call(self, to: str, selector: str, at: Any) -> bytes | None:
        """What the contract answers, or None when it reverts (no such method)."""
        assert self._rpc is not None
        try:
            answer = await self._rpc.serve("call", [to, selector, at], {})
        except BackendError as exc:
            if exc.kind is IoErrorKind.BAD_REQUEST:
                return None  # reverted, or an answer larger than the client takes
            raise
        return _hex_bytes(answer)
