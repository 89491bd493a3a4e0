"""``blockx replay TASK_ID`` against a real Worker: a task whose call fails leaves its
record with the Worker, and the replay here shows the same exception at the same
line, saving the record where it says."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from processes import EXAMPLES, WorkerProcess, call_list_task, run_to_end, serving
from typer.testing import CliRunner

from blockx_cli.app import app
from blockx_core.call_record import decode_record
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

LEDGER = """\
from blockx_executor import call, io


async def balance_line(address):
    balance = await io.memory.get(f"balance:{address}")
    return f"{address}: " + await call("format_eth", balance)


def format_eth(wei):
    return f"{wei / 10**18:.4f} ETH"
"""


async def test_blockx_replay_of_a_failed_task_shows_the_same_exception_and_line(
    etcd_server: EtcdServer, unique_lane: Any, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "ledger.py").write_text(LEDGER)
    proc = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
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
