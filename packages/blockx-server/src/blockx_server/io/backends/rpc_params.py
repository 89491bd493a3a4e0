"""The arguments of ``io.rpc`` reads as JSON-RPC takes them, and which answers are
immutable: a numeric block at or below the finalized height, or a block hash without
``requireCanonical``; never a tag."""

from __future__ import annotations

import re
from typing import Any, Final

_TAGS: Final = frozenset({"latest", "pending", "safe", "finalized", "earliest"})
HASH: Final = re.compile(r"^0x[0-9a-fA-F]{64}$")
_QUANTITY: Final = re.compile(r"^0x[0-9a-fA-F]{1,16}$")
_HEX: Final = re.compile(r"^0x(?:[0-9a-fA-F]{2})*$")
_ADDRESS: Final = re.compile(r"^0x[0-9a-fA-F]{40}$")

# Where each state read takes its block parameter.
_BLOCK_PARAM: Final = {
    "eth_getBalance": 1,
    "eth_getCode": 1,
    "eth_getTransactionCount": 1,
    "eth_getStorageAt": 2,
    "eth_call": 1,
    "eth_getBlockReceipts": 0,
}


def block_param(block: Any) -> str | dict[str, Any]:
    """A ``block`` argument as JSON-RPC takes it: a quantity, a tag or an EIP-1898 object."""
    if block is None:
        return "latest"
    if isinstance(block, bool):
        raise TypeError("a block is a number, a tag or a block hash, not a bool")
    if isinstance(block, int):
        if block < 0:
            raise ValueError(f"a block number is not negative (got {block})")
        return hex(block)
    if isinstance(block, str):
        if block in _TAGS:
            return block
        if HASH.match(block):
            return {"blockHash": block.lower()}
        if _QUANTITY.match(block):
            return hex(int(block, 16))
        raise ValueError(
            f"a block is a number, one of {', '.join(sorted(_TAGS))}, or a block hash "
            f"(got {block!r})"
        )
    if isinstance(block, dict):
        if set(block) <= {"blockHash", "requireCanonical"} and "blockHash" in block:
            if not (isinstance(block["blockHash"], str) and HASH.match(block["blockHash"])):
                raise ValueError(f"blockHash is 0x and 64 hex digits (got {block['blockHash']!r})")
            if not isinstance(block.get("requireCanonical", False), bool):
                raise TypeError("requireCanonical is a bool")
            return {**block, "blockHash": block["blockHash"].lower()}
        if set(block) == {"blockNumber"}:
            number = block_param(block["blockNumber"])
            if not isinstance(number, str) or not number.startswith("0x"):
                raise ValueError(f"blockNumber is a number (got {block['blockNumber']!r})")
            return {"blockNumber": number}
    raise TypeError(f"a block is a number, a tag or a block hash (got {block!r})")


def range_end(block: Any) -> str:
    param = block_param(block)
    if isinstance(param, dict):
        raise TypeError("logs takes block numbers or tags for from_block and to_block")
    return param


def numbered(block: Any) -> bool:
    param = block_param(block)
    return isinstance(param, str) and param.startswith("0x")


def fixed(param: str | dict[str, Any], finalized: int) -> bool:
    """Whether state or contents at ``param`` can never change."""
    if isinstance(param, dict):
        if "blockHash" in param:
            return not param.get("requireCanonical", False)
        param = param["blockNumber"]
    if isinstance(param, dict):
        return False
    return param.startswith("0x") and int(param, 16) <= finalized


def request_immutable(method: str, params: list[Any], finalized: int) -> bool:
    if method == "eth_chainId":
        return True
    if method == "eth_getBlockByHash":
        return True
    if method == "eth_getBlockByNumber":
        return fixed(block_param(params[0]), finalized)
    if method in _BLOCK_PARAM:
        index = _BLOCK_PARAM[method]
        return len(params) > index and fixed(block_param(params[index]), finalized)
    if method == "eth_getLogs":
        query = params[0]
        if "blockHash" in query:
            return True
        return numbered(query.get("fromBlock", "latest")) and fixed(
            block_param(query.get("toBlock", "latest")), finalized
        )
    return False


def address_param(value: Any) -> str:
    if not isinstance(value, str) or not _ADDRESS.match(value):
        raise ValueError(f"an address is 0x and 40 hex digits (got {value!r})")
    return value


def data_param(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _HEX.match(value):
        raise ValueError(f"{what} is 0x-prefixed hex of whole bytes (got {value!r})")
    return value


def slot_param(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**256:
        return hex(value)
    if isinstance(value, str) and re.match(r"^0x[0-9a-fA-F]{1,64}$", value):
        return value
    raise ValueError(f"a storage slot is a uint256 or 0x hex (got {value!r})")
