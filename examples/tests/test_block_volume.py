"""`block_volume` tested offline: run in a real executor against the recording of one
of its calls (examples/fixtures/block_volume.json, written by `blockx invoke
block_volume 5 --record ...` on `blockx dev up`'s chain), with the code in
examples/functions. No cluster, no chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockx_testing import CallFailed, ReplayReturned, ReplayRunner, run_function

EXAMPLES = Path(__file__).resolve().parents[1]
FUNCTIONS = EXAMPLES / "functions"
FIXTURE = EXAMPLES / "fixtures" / "block_volume.json"
RECORDED = json.loads(FIXTURE.read_text())


def test_the_recorded_block_sums_to_the_recorded_result() -> None:
    volumes = run_function("block_volume", [5], fixture=FIXTURE, functions=FUNCTIONS)
    assert volumes == RECORDED["result"]
    assert [v["transfers"] for v in volumes] == [1, 1, 2]


def test_an_edited_answer_changes_the_sum(tmp_path: Path) -> None:
    edited = json.loads(FIXTURE.read_text())
    transfers = next(io for io in edited["io"] if io["op"] == "erc20_transfers")
    first = transfers["answer"][0]
    transfers["answer"] = [first, {**first, "log_index": 9, "value": "1"}]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(edited))
    assert run_function("block_volume", [5], fixture=path, functions=FUNCTIONS) == [
        {"token": first["token"], "transfers": 2, "volume": int(first["value"]) + 1, "senders": 1}
    ]


def test_a_block_the_recording_does_not_hold_fails_not_found() -> None:
    with pytest.raises(CallFailed) as failed:
        run_function("block_volume", [6], fixture=FIXTURE, functions=FUNCTIONS)
    assert failed.value.kind == "IO_ERROR"
    assert "NOT_FOUND" in failed.value.message
    assert "no answer to io.blockdb.block(6)" in failed.value.message


def test_the_fixture_replays_its_own_call_with_the_projects_functions(
    blockx_replay: ReplayRunner,
) -> None:
    outcome = blockx_replay.outcome(fixture=FIXTURE)
    assert isinstance(outcome, ReplayReturned)
    assert outcome.served == 2
    assert outcome.value == RECORDED["result"]
