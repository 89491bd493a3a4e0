"""The devnet's contracts: their committed builds and the few ABI encodings the
devnet and tests need, written out so no ABI library is required.

* the ERC-20 test token: ``ERC20.sol``, built into ``TestToken.json``;
* an AMM-style pair of a token and ETH: ``Pair.sol``, built into ``Pair.json``.
  It emits Uniswap V2's ``Swap`` and ``Sync`` events, and its ``probe()`` makes a
  call frame of every kind (create, create2, call with value, a reverted inner
  call, staticcall, delegatecall, selfdestruct).

``build.js`` rebuilds the JSON files with solc-js (``npm run build-contracts``).
Selectors and topics are written out; tests check them against the node's keccak
(``web3_sha3``).
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
    APPROVE_SELECTOR: "approve(address,uint256)",
    SWAP_TOPIC: "Swap(address,uint256,uint256,uint256,uint256,address)",
    SYNC_TOPIC: "Sync(uint112,uint112)",
    SYNC_SELECTOR: "sync()",
    SWAP_ETH_FOR_TOKENS_SELECTOR: "swapEthForTokens(address)",
    SWAP_TOKENS_FOR_ETH_SELECTOR: "swapTokensForEth(uint256,address)",
    PROBE_SELECTOR: "probe()",
}


@cache
def _artifact(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text()
    artifact: dict[str, Any] = json.loads(text)
    return artifact


def token_artifact() -> dict[str, Any]:
    """``{"contractName", "compiler", "evmVersion", "abi", "bytecode"}``."""
    return _artifact("TestToken.json")


def pair_artifact() -> dict[str, Any]:
    """The pair's build, shaped as ``token_artifact``'s."""
    return _artifact("Pair.json")


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


def approve_data(spender: str, value: int) -> str:
    return APPROVE_SELECTOR + _address_word(spender) + _word(value)


def pair_deploy_data(token: str) -> str:
    """Creation code plus the encoded ``constructor(address token)``."""
    return str(pair_artifact()["bytecode"]) + _address_word(token)


def swap_eth_for_tokens_data(to: str) -> str:
    return SWAP_ETH_FOR_TOKENS_SELECTOR + _address_word(to)


def swap_tokens_for_eth_data(amount_in: int, to: str) -> str:
    return SWAP_TOKENS_FOR_ETH_SELECTOR + _word(amount_in) + _address_word(to)
