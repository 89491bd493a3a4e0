"""``blockx replay --fixture``: a record file replayed here in a real executor, its
ending printed against the recorded one (the same exception at the same line), and
every problem one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from blockx_cli.app import app
from blockx_cli.commands.replay import record_file_name

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "examples" / "fixtures" / "block_volume.json"


def blockx(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def broken_fixture(tmp_path: Path, failure: dict[str, str] | None = None) -> Path:
    """The example recording with one transfer's amount in hex, which token_volume
    cannot sum."""
    record = json.loads(FIXTURE.read_text())
    record["io"][1]["answer"][1]["value"] = "0x1"
    del record["result"]
    if failure is not None:
        record["failure"] = failure
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(record))
    return path


def test_the_example_recording_replays_as_recorded() -> None:
    done = blockx("replay", "--fixture", str(FIXTURE))
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"replayed block_volume(5) from {FIXTURE} with the code of epoch 1"
    assert lines[1].startswith(
        'block_volume(5) = [{"token": "0x5fbdb2315678afecb367f032d93f642f64180aa3"'
    )
    assert lines[2].startswith("as recorded: the recorded call returned [")
    assert lines[3] == f"2 IO answers served from {FIXTURE}"


def test_a_failed_call_replays_to_the_same_exception_at_the_same_line(tmp_path: Path) -> None:
    first = blockx("replay", "--json", "--fixture", str(broken_fixture(tmp_path)))
    assert first.exit_code == 1, first.output
    replayed = json.loads(first.output)
    assert replayed["failure_code"] == "USER_ERROR"
    assert replayed["raised_at"] == {"file": "chain.py", "line": 27, "function": "token_volume"}
    # The record of that failure, as a Worker keeps it: the replay matches it.
    failure = {"kind": "USER_ERROR", "message": replayed["failure_message"]}
    again = blockx("replay", "--fixture", str(broken_fixture(tmp_path, failure)))
    assert again.exit_code == 1, again.output
    assert "ValueError: invalid literal for int() with base 10: '0x1'" in again.output
    assert "raised at chain.py:27, in token_volume" in again.output
    assert (
        "as recorded: the recorded call failed USER_ERROR: ValueError: invalid literal for "
        "int() with base 10: '0x1', raised at chain.py:27, in token_volume"
    ) in again.output


def test_edited_code_replays_against_the_recording(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    source = (ROOT / "examples" / "functions" / "chain.py").read_text()
    (functions / "chain.py").write_text(
        source.replace('entry[1] += int(row["value"])', 'entry[1] += int(row["value"], 0)')
    )
    failure = {"kind": "USER_ERROR", "message": "ValueError: recorded"}
    done = blockx(
        "replay",
        "--json",
        "--fixture",
        str(broken_fixture(tmp_path, failure)),
        "--functions",
        str(functions),
    )
    assert done.exit_code == 0, done.output
    replayed = json.loads(done.output)
    assert replayed["success"] is True
    assert replayed["as_recorded"] is False
    assert replayed["value"][2]["volume"] == 100134320991584639 + 1
    assert replayed["functions_dir"] == str(functions)


def test_problems_are_one_line_and_exit_2(tmp_path: Path) -> None:
    not_a_record = tmp_path / "other.json"
    not_a_record.write_text('{"a": 1}')
    cases = [
        (("replay",), "error: give a TASK_ID or --fixture FILE (one of them)"),
        (("replay", "t1", "--fixture", str(FIXTURE)), "error: give a TASK_ID or --fixture"),
        (("replay", "--fixture", str(tmp_path / "missing.json")), "No such file or directory"),
        (("replay", "--fixture", str(not_a_record)), "not a call record"),
        (
            ("replay", "--fixture", str(FIXTURE), "--functions", str(tmp_path / "none")),
            "does not exist",
        ),
    ]
    for args, said in cases:
        done = blockx(*args)
        assert done.exit_code == 2, (args, done.output)
        assert said in done.output
        assert "Traceback" not in done.output


def test_a_task_record_is_saved_under_a_file_name_made_of_its_id() -> None:
    assert record_file_name("backfill/1", None) == "blockx-replay-backfill_1.json"
    assert record_file_name("t-2", 3) == "blockx-replay-t-2-3.json"
