"""``io.rpc``: an Ethereum node's JSON-RPC, read-only (present when CHAIN_RPC_URL is set).

Reads: ``request(method, params=[])`` for the read methods of ``READ_METHODS``
(the node's result as it is); ``balance(address, block="latest")`` (a decimal
string), ``call(to, data, block="latest")``, ``code(address, block="latest")``,
``storage(address, slot, block="latest")`` (0x hex strings), ``block(number,
full=False)``, ``receipt(tx_hash)``, ``logs(from_block, to_block, address=None,
topics=None)`` (the node's objects), ``chain_id()`` and ``block_number()`` (ints).

A ``block`` is a number, a tag (``latest``, ``pending``, ``safe``, ``finalized``,
``earliest``), a 32-byte block hash, or an EIP-1898 object (``{"blockHash": h}``,
``{"blockNumber": n}``): a function can read state at exactly the block its
builder pinned. A block or transaction the node does not know is NOT_FOUND, never
an empty result. Every answer is checked against its request before it is returned
or cached (``blockx_chain.rpc.answers.check_answer``): another block than the one
asked for, the receipt of another transaction, a log outside the range asked for or
a malformed quantity is BAD_VALUE, not retryable.

Every state-changing method (``eth_send*``, ``eth_sign*``, ``personal_*``,
``anvil_*``, ``evm_*``, ``hardhat_*``, ``miner_*``, ``admin_*``, ``debug_set*``) is
refused WRITE_FORBIDDEN before anything is sent, which fails the call whatever the
function does with the error; any other method is UNKNOWN_OP.

``immutable`` tells a read cache which answers can never change: a read naming a
numeric block at or below the finalized height, or a block hash (state and
contents at a hash are fixed; ``requireCanonical`` reads are not, since the block
may leave the canonical chain), and ``chain_id``. ``latest``, ``pending`` and the
other tags, ``block_number``, ``receipt`` and transaction reads never are.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any, Final

import msgspec

from blockx_chain.rpc import DEFAULT_MAX_RESPONSE_BYTES, JsonRpcClient, RpcError, RpcErrorKind
from blockx_chain.rpc.answers import check_answer
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.arguments import bind_arguments
from blockx_server.io.backends.rpc_params import (
    HASH,
    address_param,
    block_param,
    data_param,
    fixed,
    numbered,
    range_end,
    request_immutable,
    slot_param,
)
from blockx_server.io.errors import BackendError
from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.settings import InvalidValue, Setting, integer


class RpcSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: str | None = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    timeout_ms: int = 10_000
    max_batch: int = 100


def _rpc_url(raw: str) -> str | None:
    parts = urllib.parse.urlsplit(raw)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise InvalidValue(f"must be an http:// or https:// URL of a JSON-RPC node (got {raw!r})")
    return raw


CHAIN_RPC_URL: Final[Setting[str | None]] = Setting(
    name="CHAIN_RPC_URL",
    default=None,
    parse=_rpc_url,
    help="the Ethereum JSON-RPC node behind io.rpc (unset: no io.rpc)",
)
RPC_MAX_RESPONSE_BYTES: Final = Setting(
    name="RPC_MAX_RESPONSE_BYTES",
    default=DEFAULT_MAX_RESPONSE_BYTES,
    parse=integer(at_least=1024),
    help="a larger node answer fails BAD_REQUEST",
)
RPC_TIMEOUT_MS: Final = Setting(
    name="RPC_TIMEOUT_MS",
    default=10_000,
    parse=integer(at_least=1),
    help="one HTTP request to the node; past it the read fails UNAVAILABLE",
)
RPC_MAX_BATCH: Final = Setting(
    name="RPC_MAX_BATCH",
    default=100,
    parse=integer(at_least=1),
    help="JSON-RPC requests sent in one batch",
)
RPC_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    CHAIN_RPC_URL,
    RPC_MAX_RESPONSE_BYTES,
    RPC_TIMEOUT_MS,
    RPC_MAX_BATCH,
)


def read_rpc_settings(reader: ConfigReader) -> RpcSettings:
    """The settings above through a ``ConfigReader``."""
    return RpcSettings(
        url=reader.get(CHAIN_RPC_URL),
        max_response_bytes=reader.get(RPC_MAX_RESPONSE_BYTES),
        timeout_ms=reader.get(RPC_TIMEOUT_MS),
        max_batch=reader.get(RPC_MAX_BATCH),
    )


READ_METHODS: Final = frozenset(
    {
        "eth_call",
        "eth_getBalance",
        "eth_getCode",
        "eth_getStorageAt",
        "eth_getTransactionCount",
        "eth_getBlockByNumber",
        "eth_getBlockByHash",
        "eth_getBlockReceipts",
        "eth_getTransactionByHash",
        "eth_getTransactionReceipt",
        "eth_getLogs",
        "eth_chainId",
        "eth_blockNumber",
        "eth_gasPrice",
        "eth_feeHistory",
        "eth_estimateGas",
    }
)
_WRITE_PREFIXES: Final = (
    "eth_send",
    "eth_sign",
    "personal_",
    "anvil_",
    "evm_",
    "hardhat_",
    "miner_",
    "admin_",
    "debug_set",
)
# A null answer to these means the node does not know the block or transaction.
_NULL_IS_NOT_FOUND: Final = frozenset(
    {
        "eth_getBlockByNumber",
        "eth_getBlockByHash",
        "eth_getBlockReceipts",
        "eth_getTransactionByHash",
        "eth_getTransactionReceipt",
    }
)
_KIND: Final = {
    RpcErrorKind.UNAVAILABLE: IoErrorKind.UNAVAILABLE,
    RpcErrorKind.BAD_REQUEST: IoErrorKind.BAD_REQUEST,
    RpcErrorKind.NOT_FOUND: IoErrorKind.NOT_FOUND,
    RpcErrorKind.BAD_ANSWER: IoErrorKind.BAD_VALUE,
}


def is_write_method(method: str) -> bool:
    return method.startswith(_WRITE_PREFIXES)


class RpcBackend:
    name = "rpc"
    read_ops = frozenset(
        {
            "request",
            "balance",
            "call",
            "code",
            "storage",
            "block",
            "receipt",
            "logs",
            "chain_id",
            "block_number",
        }
    )
    write_ops: frozenset[str] = frozenset()

    def __init__(self, client: JsonRpcClient) -> None:
        self.client = client

    @classmethod
    def from_settings(cls, settings: RpcSettings) -> RpcBackend:
        assert settings.url is not None
        return cls(
            JsonRpcClient(
                settings.url,
                max_response_bytes=settings.max_response_bytes,
                timeout_s=settings.timeout_ms / 1000,
                max_batch=settings.max_batch,
            )
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        try:
            return await self._serve(op, args, kwargs)
        except RpcError as exc:
            raise BackendError(_KIND[exc.kind], exc.message) from None

    async def _serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        match op:
            case "request":
                method, params = bind_arguments(
                    args, kwargs, "request(method, params=[])", ("method",), ("params",)
                )
                return await self._request(method, params)
            case "balance":
                address, block = bind_arguments(
                    args, kwargs, 'balance(address, block="latest")', ("address",), ("block",)
                )
                raw = await self._send(
                    "eth_getBalance", [address_param(address), block_param(block)]
                )
                return str(int(raw, 16))
            case "call":
                to, data, block = bind_arguments(
                    args, kwargs, 'call(to, data, block="latest")', ("to", "data"), ("block",)
                )
                tx = {"to": address_param(to), "data": data_param(data, "data")}
                return await self._send("eth_call", [tx, block_param(block)])
            case "code":
                address, block = bind_arguments(
                    args, kwargs, 'code(address, block="latest")', ("address",), ("block",)
                )
                return await self._send("eth_getCode", [address_param(address), block_param(block)])
            case "storage":
                address, slot, block = bind_arguments(
                    args,
                    kwargs,
                    'storage(address, slot, block="latest")',
                    ("address", "slot"),
                    ("block",),
                )
                params = [address_param(address), slot_param(slot), block_param(block)]
                return await self._send("eth_getStorageAt", params)
            case "block":
                number, full = bind_arguments(
                    args, kwargs, "block(number, full=False)", ("number",), ("full",)
                )
                if full is not None and not isinstance(full, bool):
                    raise TypeError("block(number, full=False): full is a bool")
                return await self._block(number, bool(full))
            case "receipt":
                (tx_hash,) = bind_arguments(args, kwargs, "receipt(tx_hash)", ("tx_hash",))
                if not isinstance(tx_hash, str) or not HASH.match(tx_hash):
                    raise ValueError(
                        f"a transaction hash is 0x and 64 hex digits (got {tx_hash!r})"
                    )
                return await self._send("eth_getTransactionReceipt", [tx_hash])
            case "logs":
                from_block, to_block, address, topics = bind_arguments(
                    args,
                    kwargs,
                    "logs(from_block, to_block, address=None, topics=None)",
                    ("from_block", "to_block"),
                    ("address", "topics"),
                )
                return await self._logs(from_block, to_block, address, topics)
            case "chain_id":
                bind_arguments(args, kwargs, "chain_id()", ())
                return int(await self._send("eth_chainId", []), 16)
            case "block_number":
                bind_arguments(args, kwargs, "block_number()", ())
                return int(await self._send("eth_blockNumber", []), 16)
        raise BackendError(IoErrorKind.UNKNOWN_OP, op)

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """Whether the answer to this read can never change (see the module's text);
        False for anything it cannot decide."""
        try:
            match op:
                case "chain_id":
                    return True
                case "balance" | "code":
                    block = bind_arguments(args, kwargs, "", ("address",), ("block",))[1]
                    return fixed(block_param(block), finalized)
                case "call":
                    block = bind_arguments(args, kwargs, "", ("to", "data"), ("block",))[2]
                    return fixed(block_param(block), finalized)
                case "storage":
                    block = bind_arguments(args, kwargs, "", ("address", "slot"), ("block",))[2]
                    return fixed(block_param(block), finalized)
                case "block":
                    number = bind_arguments(args, kwargs, "", ("number",), ("full",))[0]
                    return fixed(block_param(number), finalized)
                case "logs":
                    from_block, to_block = bind_arguments(
                        args, kwargs, "", ("from_block", "to_block"), ("address", "topics")
                    )[:2]
                    return numbered(from_block) and fixed(block_param(to_block), finalized)
                case "request":
                    method, params = bind_arguments(args, kwargs, "", ("method",), ("params",))
                    return request_immutable(method, params or [], finalized)
        except (TypeError, ValueError, IndexError, KeyError):
            return False
        return False

    async def _request(self, method: Any, params: Any) -> Any:
        if not isinstance(method, str):
            raise TypeError("request(method: str, params: list = [])")
        if is_write_method(method):
            raise BackendError(
                IoErrorKind.WRITE_FORBIDDEN,
                f"io.rpc.request({method!r}) changes state, and io.rpc is read-only: a "
                "function may only read the chain",
            )
        if method not in READ_METHODS:
            raise BackendError(
                IoErrorKind.UNKNOWN_OP,
                f"io.rpc.request does not allow {method!r} "
                f"(reads: {', '.join(sorted(READ_METHODS))})",
            )
        params = [] if params is None else params
        if not isinstance(params, list):
            raise TypeError("request(method: str, params: list = [])")
        return await self._send(method, params)

    async def _send(self, method: str, params: list[Any]) -> Any:
        """The node's answer, once checked against the request."""
        result = await self.client.request(method, params)
        if result is None and method in _NULL_IS_NOT_FOUND:
            raise BackendError(
                IoErrorKind.NOT_FOUND, f"{method}{_params_text(params)}: the node does not know it"
            )
        return check_answer(method, params, result)

    async def _block(self, number: Any, full: bool) -> Any:
        param = block_param(number)
        if isinstance(param, dict):
            if "blockHash" in param:
                return await self._send("eth_getBlockByHash", [param["blockHash"], full])
            param = param["blockNumber"]
        return await self._send("eth_getBlockByNumber", [param, full])

    async def _logs(self, from_block: Any, to_block: Any, address: Any, topics: Any) -> Any:
        start, end = range_end(from_block), range_end(to_block)
        query: dict[str, Any] = {"fromBlock": start, "toBlock": end}
        if address is not None:
            query["address"] = (
                [address_param(a) for a in address]
                if isinstance(address, list)
                else address_param(address)
            )
        if topics is not None:
            if not isinstance(topics, list):
                raise TypeError("logs(..., topics: list of topic, list of topics or None)")
            query["topics"] = topics
        logs = self._send("eth_getLogs", [query])
        if end.startswith("0x"):
            # A range ending past the node's head is an error, not "no logs": ask for
            # the last block too (in the same JSON-RPC batch).
            answer, _ = await asyncio.gather(logs, self._send("eth_getBlockByNumber", [end, False]))
            return answer
        return await logs


def _params_text(params: list[Any]) -> str:
    return "(" + ", ".join(repr(p) for p in params) + ")"
