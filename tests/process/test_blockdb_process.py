"""Functions reading ``io.blockdb`` through the real ``blockx-worker`` and
``blockx-syncinvoker``, over SQLite and PostgreSQL databases written with the
store's write API; start-up with a bad BLOCKDB_URL or an unusable database."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_rows import TOKEN, block_hash, make_block, seed_chain
from grpclib.client import Channel
from processes import SyncInvokerProcess, WorkerProcess, call_list_task, execute_result, run_to_end
from support import free_port, wait_until

from blockx_chain.schema import SCHEMA_VERSION, TRANSFER_TOPIC
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = '''
from blockx_executor import IoError, io

async def chain_view(n):
    """Every function-visible read of block ``n``."""
    return {
        "head": await io.blockdb.head(),
        "block": await io.blockdb.block(n),
        "blocks": [b["block_number"] for b in await io.blockdb.blocks(n, n + 2)],
        "transactions": await io.blockdb.transactions(n),
        "logs": await io.blockdb.logs(n, topic0=TRANSFER),
        "transfers": await io.blockdb.erc20_transfers(n, n + 1, token=TOKEN),
        "missing": await io.blockdb.block(10_000),
    }

async def logs_of(n):
    return len(await io.blockdb.logs(n))

async def read_error(op, args):
    try:
        await getattr(io.blockdb, op)(*args)
    except IoError as exc:
        return {"kind": exc.kind, "retryable": exc.retryable, "message": exc.message}
    return None
'''


def functions_source() -> str:
    return f"TRANSFER = {TRANSFER_TOPIC!r}\nTOKEN = {TOKEN!r}\n{FUNCTIONS}"


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    d.mkdir()
    (d / "chainfns.py").write_text(functions_source())
    return d


def check_view(view: dict[str, Any], n: int) -> None:
    rows = make_block(n)
    assert view["head"] == {"number": 11, "hash": block_hash(11), "finalized": 7}
    assert view["block"]["block_hash"] == block_hash(n)
    assert view["block"]["transaction_count"] == 2
    assert view["blocks"] == [n, n + 1, n + 2]
    assert [t["transaction_hash"] for t in view["transactions"]] == [
        t.transaction_hash for t in rows.transactions
    ]
    assert view["transactions"][0]["value"] == str(rows.transactions[0].value)
    assert [log["log_index"] for log in view["logs"]] == [0, 2]
    assert [(t["block_number"], t["log_index"]) for t in view["transfers"]] == [
        (n, 0),
        (n, 2),
        (n + 1, 0),
        (n + 1, 2),
    ]
    assert view["transfers"][0]["value"] == str(2**200 + n)
    assert view["missing"] is None


async def test_a_task_on_a_real_worker_reads_the_block_database(
    etcd_server: EtcdServer,
    unique_lane: Any,
    functions_dir: Path,
    db_url: str,
    tmp_path: Path,
) -> None:
    await seed_chain(db_url, 12)
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "FUNCTIONS_DIR": str(functions_dir),
            "BLOCKDB_URL": db_url,
            "BLOCKDB_MAX_ROWS": "20",
        },
        tmp_path / "worker.log",
    )
    try:
        await worker.wait_ready()
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            calls = [[3], [5]]
            views = await run_task(stub, "t-view", "chain_view", calls)
            check_view(views[0], 3)
            check_view(views[1], 5)
            errors = await run_task(
                stub,
                "t-errors",
                "read_error",
                [["logs", [0, 11]], ["block", ["seven"]], ["put", ["k", 1]]],
            )
        finally:
            channel.close()
        too_many, bad_argument, write = errors
        assert too_many["kind"] == "BAD_REQUEST"
        assert "more than 20 rows (BLOCKDB_MAX_ROWS): narrow the range" in too_many["message"]
        assert bad_argument["kind"] == "BAD_REQUEST"
        assert "must be a block number" in bad_argument["message"]
        assert write["kind"] == "UNKNOWN_OP"
    finally:
        assert worker.stop() == 0
    assert "Traceback" not in worker.output()


def _metric(text: str, name: str) -> float:
    """The value of an unlabelled counter or gauge in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics page")


async def test_finalized_reads_are_served_from_the_cache_and_unfinalized_ones_never(
    etcd_server: EtcdServer, unique_lane: Any, functions_dir: Path, tmp_path: Path
) -> None:
    """The chain row says blocks 0..7 are final: a second read of block 3 is a cache
    hit; reads of block 9 (above the finalized height) always reach the database."""
    url = f"sqlite:///{tmp_path}/chain.db"
    await seed_chain(url, 12)
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "FUNCTIONS_DIR": str(functions_dir),
            "BLOCKDB_URL": url,
            "IO_FINALITY_REFRESH_MS": "50",
        },
        tmp_path / "worker.log",
    )
    try:
        await worker.wait_ready()
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)

            async def finality_known() -> bool:
                await run_task(stub, f"t-warm-{os.urandom(4).hex()}", "logs_of", [[2]])
                return _metric(worker.metrics(), "blockx_io_cache_bytes") > 0

            await wait_until(finality_known, "the first finalized read cached", timeout=20)
            before = worker.metrics()
            logs = len(make_block(3).logs)
            assert await run_task(stub, "t-final-1", "logs_of", [[3]]) == [logs]
            assert await run_task(stub, "t-final-2", "logs_of", [[3]]) == [logs]
            middle = worker.metrics()
            assert await run_task(stub, "t-head-1", "logs_of", [[9]]) == [logs]
            assert await run_task(stub, "t-head-2", "logs_of", [[9]]) == [logs]
            after = worker.metrics()
        finally:
            channel.close()
        hits = "blockx_io_cache_hits_total"
        misses = "blockx_io_cache_misses_total"
        assert _metric(middle, hits) - _metric(before, hits) == 1
        assert _metric(middle, misses) - _metric(before, misses) == 1
        assert _metric(after, hits) == _metric(middle, hits)
    finally:
        assert worker.stop() == 0


async def run_task(
    stub: worker_v1.WorkerServiceStub, task_id: str, function: str, calls: list[list[Any]]
) -> list[Any]:
    """The outputs of a task that must succeed."""
    final = await run_to_end(stub, call_list_task(task_id, function, calls), timeout=30)
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    values: list[Any] = json.loads(execute_result(final).plugin_results[0].result)
    return values


@pytest.fixture
def invoker_env(functions_dir: Path) -> dict[str, str]:
    return {"FUNCTIONS_DIR": str(functions_dir)}


@pytest.fixture
def started() -> Iterator[list[SyncInvokerProcess]]:
    processes: list[SyncInvokerProcess] = []
    yield processes
    for process in processes:
        if process.alive():
            process.kill()


async def test_the_sync_invoker_reads_it_and_without_blockdb_url_names_the_variable(
    invoker_env: dict[str, str],
    started: list[SyncInvokerProcess],
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/chain.db"
    await seed_chain(url, 12)
    with_db = SyncInvokerProcess({**invoker_env, "BLOCKDB_URL": url}, tmp_path / "with.log")
    without = SyncInvokerProcess(invoker_env, tmp_path / "without.log")
    started += [with_db, without]
    await with_db.wait_ready()
    check_view(await with_db.invoke("chain_view", [4]), 4)
    await without.wait_ready()
    missing = await without.invoke("read_error", ["head", []])
    assert missing["kind"] == "UNKNOWN_BACKEND"
    assert "set BLOCKDB_URL to enable io.blockdb" in missing["message"]
    assert with_db.stop() == 0
    assert without.stop() == 0


async def test_an_unreachable_database_is_a_retryable_unavailable(
    invoker_env: dict[str, str], started: list[SyncInvokerProcess], tmp_path: Path
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    process = SyncInvokerProcess({**invoker_env, "BLOCKDB_URL": url}, tmp_path / "si.log")
    started.append(process)
    await process.wait_ready()  # the database may come up later
    error = await process.invoke("read_error", ["block", [1]])
    assert error["kind"] == "UNAVAILABLE"
    assert error["retryable"] is True
    assert "unreachable" in error["message"]
    assert process.stop() == 0


def start_and_fail(program: str, env: dict[str, str]) -> list[str]:
    binary = shutil.which(program)
    assert binary is not None
    listen = "SYNC_INVOKER_LISTEN" if program == "blockx-syncinvoker" else "WORKER_LISTEN"
    done = subprocess.run(
        [binary],
        env={**os.environ, listen: f"127.0.0.1:{free_port()}", "BLOCKX_LOG_LEVEL": "ERROR", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines: list[str] = done.stderr.strip().splitlines()
    return lines


@pytest.mark.parametrize("program", ["blockx-syncinvoker", "blockx-worker"])
@pytest.mark.parametrize("url", ["sqlite://rel.db", "mysql://h/db", "postgresql://host:99999/db"])
def test_a_malformed_blockdb_url_refuses_start_up_in_one_line(
    program: str, url: str, functions_dir: Path
) -> None:
    lines = start_and_fail(program, {"FUNCTIONS_DIR": str(functions_dir), "BLOCKDB_URL": url})
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{program}: invalid configuration: BLOCKDB_URL must be sqlite:")


def test_a_database_of_a_newer_schema_refuses_start_up(functions_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    lines = start_and_fail(
        "blockx-syncinvoker",
        {"FUNCTIONS_DIR": str(functions_dir), "BLOCKDB_URL": f"sqlite:///{path}"},
    )
    assert lines == [
        f"blockx-syncinvoker: cannot start: BLOCKDB_URL: sqlite:///{path} has schema version "
        f"{SCHEMA_VERSION + 1}, newer than this BlockX's ({SCHEMA_VERSION}): upgrade BlockX"
    ]
