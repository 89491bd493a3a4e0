"""The ERC-20 test token: its committed build (``TestToken.json``) and the few ABI
encodings the devnet and tests need, written out so no ABI library is required.

``ERC20.sol`` is the source; ``build.js`` rebuilds ``TestToken.json`` with solc-js
(``npm run build-contracts``). Selectors and the Transfer topic are the standard
ERC-20 ones (tests check them against the node's keccak, ``web3_sha3``).
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

SIGNATURES: Final = {
    TRANSFER_TOPIC: "Transfer(address,address,uint256)",
    TRANSFER_SELECTOR: "transfer(address,uint256)",
    BALANCE_OF_SELECTOR: "balanceOf(address)",
    TOTAL_SUPPLY_SELECTOR: "totalSupply()",
}


@cache
def token_artifact() -> dict[str, Any]:
    """``{"contractName", "compiler", "evmVersion", "abi", "bytecode"}``."""
    text = resources.files(__package__).joinpath("TestToken.json").read_text()
    artifact: dict[str, Any] = json.loads(text)
    return artifact


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
