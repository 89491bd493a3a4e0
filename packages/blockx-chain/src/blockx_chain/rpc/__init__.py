"""The Ethereum JSON-RPC client: batching, bounded answers, classified errors, and the
checks a node's answer meets before it is believed."""

from blockx_chain.rpc.answers import parse_quantity
from blockx_chain.rpc.client import DEFAULT_MAX_RESPONSE_BYTES, JsonRpcClient, RpcStats
from blockx_chain.rpc.errors import RpcError, RpcErrorKind
from blockx_chain.rpc.eth import EthRpc, quantity

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
