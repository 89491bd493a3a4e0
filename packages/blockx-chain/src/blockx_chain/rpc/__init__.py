"""The Ethereum JSON-RPC client: batching, bounded answers, classified errors."""

from blockx_chain.rpc.client import DEFAULT_MAX_RESPONSE_BYTES, JsonRpcClient, RpcStats
from blockx_chain.rpc.errors import RpcError, RpcErrorKind
from blockx_chain.rpc.eth import EthRpc, parse_quantity, quantity

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "EthRpc",
    "JsonRpcClient",
    "RpcError",
    "RpcErrorKind",
    "RpcStats",
    "parse_quantity",
    "quantity",
]
