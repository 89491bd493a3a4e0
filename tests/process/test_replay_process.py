"""Record and replay against the real servers: ``blockx invoke --record`` saves what
the Sync Invoker's DebugInvoke recorded (its IO, sub-calls' included, its code and
ending), ``blockx replay TASK_ID`` fetches what a Worker kept of a failed call, and
the replay runs it again offline, in real executors, to the same result, or to the
same exception at the same line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import (
    EXAMPLES,
    SyncInvokerProcess,
    WorkerProcess,
    call_list_task,
    run_to_end,
    serving,
)
from typer.testing import CliRunner

from blockx_cli.app import app
from blockx_core.call_record import decode_record
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_testing import CallFailed, run_function

LEDGER = """\
from blockx_executor import call, io


async def balance_line(address):
    balance = await io.memory.get(f"balance:{address}")
    return f"{address}: " + await call("format_eth", balance)


def format_eth(wei):
    return f"{wei / 10**18:.4f} ETH"
"""


@pytest.fixture(scope="module")
def invoker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncInvokerProcess]:
    base = tmp_path_factory.mktemp("replay")
    process = SyncInvokerProcess(
        {
            "FUNCTIONS_DIR": str(functions_dir(base)),
            "IO_MEMORY_SEED_FILE": str(EXAMPLES / "memory_seed.json"),
        },
        base / "syncinvoker.log",
    )
    try:
        asyncio.run(process.wait_ready())
        yield process
    finally:
        if process.alive():
            process.kill()


def functions_dir(base: Path) -> Path:
    functions = base / "functions"
    functions.mkdir()
    (functions / "ledger.py").write_text(LEDGER)
    return functions


def blockx(invoker: SyncInvokerProcess, *args: str) -> Any:
    return CliRunner().invoke(
        app, ["--direct", "--sync-invoker", invoker.addr, *args], catch_exceptions=False
    )


def test_a_recorded_call_replays_to_the_same_result(
    invoker: SyncInvokerProcess, tmp_path: Path
) -> None:
    path = tmp_path / "greet.json"
    done = blockx(invoker, "invoke", "balance_line", "0xabc", "--record", str(path))
    assert done.exit_code == 0, done.output
    assert 'balance_line("0xabc") = "0xabc: 1.5000 ETH"' in done.output
    assert f"record saved to {path}" in done.output
    record = decode_record(path.read_bytes())
    assert (record.function, record.args, record.result) == (
        "balance_line",
        ["0xabc"],
        "0xabc: 1.5000 ETH",
    )
    assert [(io.backend, io.op, io.args, io.answer) for io in record.io] == [
        ("memory", "get", ["balance:0xabc"], 1500000000000000000)
    ]
    assert sorted(record.code) == ["ledger"]

    replayed = blockx(invoker, "replay", "--fixture", str(path))
    assert replayed.exit_code == 0, replayed.output
    assert 'balance_line("0xabc") = "0xabc: 1.5000 ETH"' in replayed.output
    assert 'as recorded: the recorded call returned "0xabc: 1.5000 ETH"' in replayed.output
    # An edited answer changes the result; what the record lacks fails NOT_FOUND.
    edited = path.read_text().replace("1500000000000000000", "2500000000000000000")
    (tmp_path / "edited.json").write_text(edited)
    assert run_function(fixture=tmp_path / "edited.json") == "0xabc: 2.5000 ETH"
    with pytest.raises(CallFailed) as missing:
        run_function("balance_line", ["0xdef"], fixture=path)
    assert "no answer to io.memory.get('balance:0xdef')" in missing.value.message


def test_a_failed_call_replays_to_the_same_exception_at_the_same_line(
    invoker: SyncInvokerProcess, tmp_path: Path
) -> None:
    path = tmp_path / "unknown.json"
    # No balance for this address: format_eth(None) raises in the sub-call, and the
    # root call fails with the sub-call's error.
    done = blockx(invoker, "invoke", "balance_line", "0x999", "--record", str(path))
    assert done.exit_code == 1, done.output
    record = decode_record(path.read_bytes())
    assert record.failure is not None
    assert 'File "ledger.py", line 6, in balance_line' in record.failure.message

    replayed = blockx(invoker, "replay", "--json", "--fixture", str(path))
    assert replayed.exit_code == 1, replayed.output
    shown = json.loads(replayed.output)
    assert shown["as_recorded"] is True
    assert shown["failure_code"] == str(record.failure.kind)
    assert shown["failure_message"] == record.failure.message
    # Where the exception was raised: in the sub-call, whose traceback the root's carries.
    assert shown["raised_at"] == {"file": "ledger.py", "line": 10, "function": "format_eth"}
    text = blockx(invoker, "replay", "--fixture", str(path))
    assert "raised at ledger.py:10, in format_eth" in text.output
    assert "as recorded: the recorded call failed" in text.output


def test_a_record_file_that_cannot_be_written_is_one_line_before_the_call(
    invoker: SyncInvokerProcess, tmp_path: Path
) -> None:
    nowhere = tmp_path / "missing" / "r.json"
    done = blockx(invoker, "invoke", "balance_line", "0xabc", "--record", str(nowhere))
    assert done.exit_code == 2
    assert f"error: cannot write the record to {nowhere}: no directory" in done.output
    assert "Traceback" not in done.output
    directory = tmp_path / "a_directory.json"
    directory.mkdir()
    done = blockx(invoker, "invoke", "balance_line", "0xabc", "--record", str(directory))
    assert done.exit_code == 2
    assert f"error: cannot write the record to {directory}: Is a directory" in done.output


async def test_blockx_replay_of_a_failed_task_shows_the_same_exception_and_line(
    etcd_server: EtcdServer, unique_lane: Any, tmp_path: Path
) -> None:
    proc = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions_dir(tmp_path)),
            "IO_MEMORY_SEED_FILE": str(EXAMPLES / "memory_seed.json"),
        },
        tmp_path / "worker.log",
    )
    async with serving(proc) as (stub,):
        task = call_list_task("replay-1", "balance_line", [["0xabc"], ["0x999"]])
        final = await run_to_end(stub, task)
        assert final.state == worker_v1.TaskState.FAILED, final
        saved = tmp_path / "saved.json"
        args = ["--direct", "replay", "replay-1", "--worker", proc.addr, "--save", str(saved)]
        done = await asyncio.to_thread(CliRunner().invoke, app, args, catch_exceptions=False)
        assert done.exit_code == 1, done.output
        assert f"saved the record of task replay-1's failed call to {saved}" in done.output
        assert "TypeError: unsupported operand type(s) for /: 'NoneType' and 'int'" in done.output
        assert "raised at ledger.py:10, in format_eth" in done.output
        assert "as recorded: the recorded call failed USER_ERROR" in done.output
        record = decode_record(saved.read_bytes())
        assert (record.function, record.args) == ("balance_line", ["0x999"])
        assert [(io.backend, io.op, io.args) for io in record.io] == [
            ("memory", "get", ["balance:0x999"])
        ]
        as_json = await asyncio.to_thread(
            CliRunner().invoke, app, [*args[:-2], "--call", "1", "--json"], catch_exceptions=False
        )
        shown = json.loads(as_json.output)
        assert shown["as_recorded"] is True
        assert shown["raised_at"] == {"file": "ledger.py", "line": 10, "function": "format_eth"}
        missing = await asyncio.to_thread(
            CliRunner().invoke, app, [*args[:-2], "--call", "0"], catch_exceptions=False
        )
        assert missing.exit_code == 1
        assert "Traceback" not in missing.output
