"""`block_volume` tested offline: run in a real executor against the recording of one
of its calls (examples/fixtures/block_volume.json, written by `blockx invoke --record`),
with the code in examples/functions. No cluster, no chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockx_testing import CallFailed, ReplayReturned, ReplayRunner, run_function

EXAMPLES = Path(__file__).resolve().parents[1]
FUNCTIONS = EXAMPLES / "functions"
FIXTURE = EXAMPLES / "fixtures" / "block_volume.json"
TOKEN = "0x5fbdb2315678afecb367f032d93f642f64180aa3"


def test_the_recorded_block_sums_to_the_recorded_result() -> None:
    recorded = json.loads(FIXTURE.read_text())
    assert (
        run_function("block_volume", [123], fixture=FIXTURE, functions=FUNCTIONS)
        == (recorded["result"])
    )
    assert recorded["result"] == [
        {"token": TOKEN, "transfers": 3, "volume": 10**24 + 1_750_000_000_000_000_007, "senders": 2}
    ]


def test_an_edited_answer_changes_the_sum(tmp_path: Path) -> None:
    recorded = json.loads(FIXTURE.read_text())
    transfers = next(io for io in recorded["io"] if io["op"] == "erc20_transfers")
    transfers["answer"] = transfers["answer"][:1]
    edited = tmp_path / "one_transfer.json"
    edited.write_text(json.dumps(recorded))
    assert run_function("block_volume", [123], fixture=edited, functions=FUNCTIONS) == [
        {"token": TOKEN, "transfers": 1, "volume": 1_500_000_000_000_000_000, "senders": 1}
    ]


def test_a_block_the_recording_does_not_hold_fails_not_found() -> None:
    with pytest.raises(CallFailed) as failed:
        run_function("block_volume", [124], fixture=FIXTURE, functions=FUNCTIONS)
    assert failed.value.kind == "IO_ERROR"
    assert "NOT_FOUND" in failed.value.message
    assert "no answer to io.blockdb.block(124)" in failed.value.message


def test_the_fixture_replays_its_own_call_with_the_projects_functions(
    blockx_replay: ReplayRunner,
) -> None:
    outcome = blockx_replay.outcome(fixture=FIXTURE)
    assert isinstance(outcome, ReplayReturned)
    assert outcome.served == 2
    assert outcome.value == json.loads(FIXTURE.read_text())["result"]
