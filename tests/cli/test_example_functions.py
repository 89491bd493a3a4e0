"""The example chain functions on rows shaped as the block database gives them
(uint256 amounts as decimal strings): exact sums, one row per token, None for no row."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

CHAIN = Path(__file__).resolve().parents[2] / "examples" / "functions" / "chain.py"
A, B = "0x" + "aa" * 20, "0x" + "bb" * 20
ALICE, BOB = "0x" + "01" * 20, "0x" + "02" * 20


@pytest.fixture(scope="module")
def chain() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_chain", CHAIN)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transfer(log_index: int, token: str, sender: str, value: int) -> dict[str, object]:
    return {
        "block_number": 7,
        "log_index": log_index,
        "token": token,
        "from_address": sender,
        "to_address": BOB,
        "value": str(value),
    }


def test_token_volume_sums_each_token_exactly(chain: ModuleType) -> None:
    big = 2**200 + 1
    rows = [
        transfer(0, B, ALICE, big),
        transfer(1, A, ALICE, 5),
        transfer(2, B, BOB, big),
        transfer(3, B, ALICE, 1),
    ]
    assert chain.token_volume({"block": {"block_number": 7}, "rows": rows}) == [
        {"token": A, "transfers": 1, "volume": 5, "senders": 1},
        {"token": B, "transfers": 3, "volume": 2 * big + 1, "senders": 2},
    ]
    assert chain.token_volume({"block": {"block_number": 8}, "rows": []}) == []


def test_large_transfers_keeps_only_what_reaches_the_threshold(chain: ModuleType) -> None:
    assert chain.large_transfers(transfer(0, A, ALICE, 10), threshold=11) is None
    assert chain.large_transfers(transfer(4, A, ALICE, 2**70), threshold=11) == {
        "log_index": 4,
        "token": A,
        "from_address": ALICE,
        "to_address": BOB,
        "value": 2**70,
    }


def test_swap_takes_the_decoded_event_as_the_worker_gives_it(chain: ModuleType) -> None:
    event = {
        "name": "Swap",
        "signature": "Swap(address,uint256,uint256,uint256,uint256,address)",
        "args": {
            "sender": ALICE,
            "amount0In": 0,
            "amount1In": 10**16,
            "amount0Out": 2**200,
            "amount1Out": 0,
            "to": BOB,
        },
    }
    call = {"block": {"block_number": 7}, "log": {"log_index": 3}, "event": event}
    assert chain.swap(call) == {
        "log_index": 3,
        "trader": ALICE,
        "tokens_in": 0,
        "eth_in": 10**16,
        "tokens_out": 2**200,
        "eth_out": 0,
    }
