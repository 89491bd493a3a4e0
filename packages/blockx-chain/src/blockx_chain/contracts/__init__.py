"""The devnet's contracts: their committed builds and the few ABI encodings the
devnet and tests need, written out so no ABI library is required.

* ``ERC20.sol`` → ``TestToken.json``: the ERC-20 test token;
* ``ERC721.sol`` → ``TestNFT.json``: a minimal ERC-721 (mint, transferFrom);
* ``ERC1155.sol`` → ``TestMultiToken.json``: a minimal ERC-1155 (mint,
  safeTransferFrom, safeBatchTransferFrom);
* ``RawLogs.sol`` → ``RawLogs.json``: emits any log it is given, for tests of logs
  that break a standard's layout;
* ``Pair.sol`` → ``Pair.json``: an AMM-style pair of a token and ETH. It emits
  Uniswap V2's ``Swap`` and ``Sync`` events, and its ``probe()`` makes a call frame
  of every kind (create, create2, call with value, a reverted inner call,
  staticcall, delegatecall, selfdestruct).

``build.js`` rebuilds the JSON files with solc-js (``npm run build-contracts``).
Selectors and event topics are the standard ones, written out; tests check them
against the node's keccak (``web3_sha3``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Final

TRANSFER_TOPIC: Final = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
TRANSFER_SELECTOR: Final = "0xa9059cbb"  # transfer(address,uint256)
BALANCE_OF_SELECTOR: Final = "0x70a08231"  # balanceOf(address)
TOTAL_SUPPLY_SELECTOR: Final = "0x18160ddd"  # totalSupply()

TRANSFER_SINGLE_TOPIC: Final = "0xc3d58168c5ae7397731d063d5bbf3d657854427343f4c083240f7aacaa2d0f62"
TRANSFER_BATCH_TOPIC: Final = "0x4a39dc06d4c0dbc64b70af90fd698a233a518aa5d07e595d983b8c0526c8f7fb"
NFT_MINT_SELECTOR: Final = "0x40c10f19"  # mint(address,uint256)
NFT_TRANSFER_FROM_SELECTOR: Final = "0x23b872dd"  # transferFrom(address,address,uint256)
MULTI_MINT_SELECTOR: Final = "0x156e29f6"  # mint(address,uint256,uint256)
SAFE_TRANSFER_FROM_SELECTOR: Final = "0xf242432a"
SAFE_BATCH_TRANSFER_FROM_SELECTOR: Final = "0x2eb2c2d6"
SET_APPROVAL_FOR_ALL_SELECTOR: Final = "0xa22cb465"  # setApprovalForAll(address,bool)
EMIT_LOG_SELECTOR: Final = "0xedebc13b"  # emitLog(bytes32[],bytes)
APPROVE_SELECTOR: Final = "0x095ea7b3"  # approve(address,uint256)
SWAP_TOPIC: Final = "0xd78ad95fa46c994b6551d0da85fc275fe613ce37657fb8d5e3d130840159d822"
SYNC_TOPIC: Final = "0x1c411e9a96e071241c2f21f7726b17ae89e3cab4c78be50e062b03a9fffbbad1"
SYNC_SELECTOR: Final = "0xfff6cae9"  # sync()
SWAP_ETH_FOR_TOKENS_SELECTOR: Final = "0xfea2994f"  # swapEthForTokens(address)
SWAP_TOKENS_FOR_ETH_SELECTOR: Final = "0x3120cc05"  # swapTokensForEth(uint256,address)
PROBE_SELECTOR: Final = "0xb74af5a9"  # probe()

SIGNATURES: Final = {
    TRANSFER_TOPIC: "Transfer(address,address,uint256)",
    TRANSFER_SELECTOR: "transfer(address,uint256)",
    BALANCE_OF_SELECTOR: "balanceOf(address)",
    TOTAL_SUPPLY_SELECTOR: "totalSupply()",
    TRANSFER_SINGLE_TOPIC: "TransferSingle(address,address,address,uint256,uint256)",
    TRANSFER_BATCH_TOPIC: "TransferBatch(address,address,address,uint256[],uint256[])",
    NFT_MINT_SELECTOR: "mint(address,uint256)",
    NFT_TRANSFER_FROM_SELECTOR: "transferFrom(address,address,uint256)",
    MULTI_MINT_SELECTOR: "mint(address,uint256,uint256)",
    SAFE_TRANSFER_FROM_SELECTOR: "safeTransferFrom(address,address,uint256,uint256,bytes)",
    SAFE_BATCH_TRANSFER_FROM_SELECTOR: (
        "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)"
    ),
    SET_APPROVAL_FOR_ALL_SELECTOR: "setApprovalForAll(address,bool)",
    EMIT_LOG_SELECTOR: "emitLog(bytes32[],bytes)",
    APPROVE_SELECTOR: "approve(address,uint256)",
    SWAP_TOPIC: "Swap(address,uint256,uint256,uint256,uint256,address)",
    SYNC_TOPIC: "Sync(uint112,uint112)",
    SYNC_SELECTOR: "sync()",
    SWAP_ETH_FOR_TOKENS_SELECTOR: "swapEthForTokens(address)",
    SWAP_TOKENS_FOR_ETH_SELECTOR: "swapTokensForEth(uint256,address)",
    PROBE_SELECTOR: "probe()",
}


@cache
def artifact(name: str) -> dict[str, Any]:
    """``<name>.json``: ``{"contractName", "compiler", "evmVersion", "abi", "bytecode"}``."""
    text = resources.files(__package__).joinpath(f"{name}.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def token_artifact() -> dict[str, Any]:
    return artifact("TestToken")


def pair_artifact() -> dict[str, Any]:
    return artifact("Pair")


def _word(value: int) -> str:
    if not 0 <= value < 2**256:
        raise ValueError(f"not a uint256: {value}")
    return f"{value:064x}"


def _address_word(address: str) -> str:
    raw = address.lower().removeprefix("0x")
    if len(raw) != 40:
        raise ValueError(f"not an address: {address!r}")
    return raw.rjust(64, "0")


def _string_tail(text: str) -> str:
    data = text.encode()
    padded = data.hex().ljust(((len(data) + 31) // 32) * 64, "0")
    return _word(len(data)) + padded


def deploy_data(name: str, symbol: str, supply: int) -> str:
    """Creation code plus the encoded ``constructor(string, string, uint256)``."""
    name_tail = _string_tail(name)
    head = _word(3 * 32) + _word(3 * 32 + len(name_tail) // 2) + _word(supply)
    return str(token_artifact()["bytecode"]) + head + name_tail + _string_tail(symbol)


def transfer_data(to: str, value: int) -> str:
    return TRANSFER_SELECTOR + _address_word(to) + _word(value)


def balance_of_data(owner: str) -> str:
    return BALANCE_OF_SELECTOR + _address_word(owner)


def address_topic(address: str) -> str:
    """An address as an indexed-event topic (left-padded to 32 bytes)."""
    return "0x" + _address_word(address)


def _uint_array(values: list[int]) -> str:
    return _word(len(values)) + "".join(_word(v) for v in values)


def _bytes_tail(data: bytes) -> str:
    return _word(len(data)) + data.hex().ljust(((len(data) + 31) // 32) * 64, "0")


def nft_deploy_data(name: str, symbol: str) -> str:
    """TestNFT's creation code plus the encoded ``constructor(string, string)``."""
    name_tail = _string_tail(name)
    head = _word(2 * 32) + _word(2 * 32 + len(name_tail) // 2)
    return str(artifact("TestNFT")["bytecode"]) + head + name_tail + _string_tail(symbol)


def multi_token_deploy_data() -> str:
    return str(artifact("TestMultiToken")["bytecode"])


def raw_logs_deploy_data() -> str:
    return str(artifact("RawLogs")["bytecode"])


def nft_mint_data(to: str, token_id: int) -> str:
    return NFT_MINT_SELECTOR + _address_word(to) + _word(token_id)


def nft_transfer_from_data(sender: str, to: str, token_id: int) -> str:
    return NFT_TRANSFER_FROM_SELECTOR + _address_word(sender) + _address_word(to) + _word(token_id)


def multi_mint_data(to: str, token_id: int, amount: int) -> str:
    return MULTI_MINT_SELECTOR + _address_word(to) + _word(token_id) + _word(amount)


def set_approval_for_all_data(operator: str, approved: bool) -> str:
    return SET_APPROVAL_FOR_ALL_SELECTOR + _address_word(operator) + _word(int(approved))


def safe_transfer_from_data(
    sender: str, to: str, token_id: int, amount: int, data: bytes = b""
) -> str:
    head = _address_word(sender) + _address_word(to) + _word(token_id) + _word(amount)
    return SAFE_TRANSFER_FROM_SELECTOR + head + _word(5 * 32) + _bytes_tail(data)


def safe_batch_transfer_from_data(
    sender: str, to: str, token_ids: list[int], amounts: list[int], data: bytes = b""
) -> str:
    ids, values = _uint_array(token_ids), _uint_array(amounts)
    offsets = [5 * 32, 5 * 32 + len(ids) // 2, 5 * 32 + (len(ids) + len(values)) // 2]
    head = _address_word(sender) + _address_word(to) + "".join(_word(o) for o in offsets)
    return SAFE_BATCH_TRANSFER_FROM_SELECTOR + head + ids + values + _bytes_tail(data)


def emit_log_data(topics: list[str], data: str) -> str:
    """RawLogs.emitLog: a log with these topics (0x hex words) and data (0x hex)."""
    words = [t.removeprefix("0x").rjust(64, "0") for t in topics]
    raw = bytes.fromhex(data.removeprefix("0x"))
    topics_part = _word(len(words)) + "".join(words)
    head = _word(2 * 32) + _word(2 * 32 + len(topics_part) // 2)
    return EMIT_LOG_SELECTOR + head + topics_part + _bytes_tail(raw)


def approve_data(spender: str, value: int) -> str:
    return APPROVE_SELECTOR + _address_word(spender) + _word(value)


def pair_deploy_data(token: str) -> str:
    """Creation code plus the encoded ``constructor(address token)``."""
    return str(pair_artifact()["bytecode"]) + _address_word(token)


def swap_eth_for_tokens_data(to: str) -> str:
    return SWAP_ETH_FOR_TOKENS_SELECTOR + _address_word(to)


def swap_tokens_for_eth_data(amount_in: int, to: str) -> str:
    return SWAP_TOKENS_FOR_ETH_SELECTOR + _word(amount_in) + _address_word(to)
