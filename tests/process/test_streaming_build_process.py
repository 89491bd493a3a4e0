"""Streaming build on real bundle Workers: BlockBundleCallConfig over a range far
larger than the IO and call windows (tens of thousands of rows written straight
into SQLite, BLOCKDB_MAX_ROWS and the call window small), the scan feeding the
dispatcher as it reads. A Worker with STREAM_BUILD_ENABLED=false builds the same
task eagerly; both must write the same rows, each source row once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from chain_bulk import bulk_chain, transfer_value
from chain_rows import CHAIN_ID, block_hash
from grpclib.client import Channel
from processes import EXAMPLES, WorkerProcess, execute_result, run_to_end, serving
from support import wait_until

from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_core.registry import RegistryKind
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

# Rows of blocks >= 1000 read io.memory once per block, so the Worker's IO metrics
# count the blocks whose calls ran.
FUNCTIONS = """
from blockx_executor import io

async def tag(row):
    if row["block_number"] >= 1000 and row["log_index"] == 0:
        await io.memory.get(f"seen:{row['block_number']}", 0)
    return {"log_index": row["log_index"], "value": row["value"]}

def fails_at_500(row):
    if row["block_number"] == 500:
        raise ValueError("block 500 is the bad one")
    return {"log_index": row["log_index"]}

def stuck_at_300(row):
    # Blocks from 300 on never return: the bundles before them commit, no other does.
    import time
    while row["block_number"] >= 300:
        time.sleep(0.01)
    return {"log_index": row["log_index"], "value": row["value"]}
"""
BLOCKS = 1500
PER_BLOCK = 20
FULL_RANGE = (0, 999)  # 20,000 rows
GAP = 1300  # not in the block database: a range over it fails there
MAX_ROWS = 500  # BLOCKDB_MAX_ROWS: a chunk is at most 25 blocks here

Stubs = tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub, str]


@pytest.fixture
async def workers(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> AsyncIterator[tuple[WorkerProcess, WorkerProcess, str]]:
    chain = tmp_path / "chain.db"
    await bulk_chain(chain, BLOCKS, PER_BLOCK, missing={GAP})
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "tag.py").write_text(FUNCTIONS)
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    env = worker_env(etcd_server, tmp_path)
    streaming = WorkerProcess(
        {**env, "WORKER_REGISTRY_PREFIX": unique_lane(RegistryKind.BUNDLE)},
        tmp_path / "streaming.log",
        program="blockx-bundle-worker",
    )
    eager = WorkerProcess(
        {
            **env,
            "WORKER_REGISTRY_PREFIX": unique_lane(RegistryKind.BUNDLE),
            "STREAM_BUILD_ENABLED": "false",
        },
        tmp_path / "eager.log",
        program="blockx-bundle-worker",
    )
    async with serving(streaming, eager):
        yield streaming, eager, sink_url


def worker_env(etcd_server: EtcdServer, tmp_path: Path) -> dict[str, str]:
    return {
        "ETCD_ENDPOINTS": etcd_server.endpoint,
        "FUNCTIONS_DIR": str(tmp_path / "functions"),
        "BLOCKDB_URL": f"sqlite:///{tmp_path / 'chain.db'}",
        "BLOCKDB_MAX_ROWS": str(MAX_ROWS),
        "SINK_DB_URL": f"sqlite:///{tmp_path}/sink.db",
        "TASK_INITIAL_INFLIGHT_CALLS": "8",
        "TASK_MAX_INFLIGHT_CALLS": "64",
        "SCAN_SLOTS": "1",
    }


def bundle_task(
    task_id: str, start: int, end: int, table: str, **extra: Any
) -> worker_v1.TaskInput:
    config = {
        "function": "tag",
        "table": "erc20_transfers",
        "fromBlock": start,
        "toBlock": end,
        "bundleSize": 100,
        **extra,
    }
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="BlockBundleCallConfig", config=json.dumps(config)
        ),
        result_handler=worker_v1.ResultHandler(
            type="BlockBundleWriteResultHandler", config=json.dumps({"table": table})
        ),
    )


async def run_on(worker: WorkerProcess, task: worker_v1.TaskInput) -> worker_v1.TaskUpdate:
    channel = Channel("127.0.0.1", worker.port)
    try:
        return await run_to_end(worker_v1.WorkerServiceStub(channel), task, timeout=120)
    finally:
        channel.close()


async def sink_rows(url: str, table: str) -> list[dict[str, Any]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        return await sink.rows(table)
    finally:
        await sink.close()


async def ledger_blocks(url: str, table: str) -> list[int]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        return [w["block_number"] for w in await sink.written(table, CHAIN_ID)]
    finally:
        await sink.close()


def committed_bundles(final: worker_v1.TaskUpdate, table: str) -> list[list[int]]:
    """The bundles a failed streamed task's plugin result says were committed."""
    (plugin,) = execute_result(final).plugin_results
    assert (plugin.plugin_name, plugin.success) == ("BlockBundleWriteResultHandler", False)
    result = json.loads(plugin.result)
    assert result["table"] == table
    committed: list[list[int]] = result["committed"]
    return committed


async def assert_whole_bundles(
    url: str, table: str, committed: list[list[int]], first: int, size: int = 100
) -> None:
    """The sink holds exactly the ``committed`` bundles: consecutive whole bundles
    of ``size`` blocks from ``first``, every block in the ledger with all its rows."""
    assert committed == [
        [first + k * size, first + (k + 1) * size - 1, size, size * PER_BLOCK]
        for k in range(len(committed))
    ]
    blocks = list(range(first, first + len(committed) * size))
    assert await ledger_blocks(url, table) == blocks
    rows = await sink_rows(url, table)
    assert sorted((r["block_number"], r["log_index"]) for r in rows) == [
        (n, i) for n in blocks for i in range(PER_BLOCK)
    ]


def counter(metrics: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in metrics.splitlines():
        match = re.match(rf"{name}(?:_total)?\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def test_a_streamed_range_calls_every_row_once_and_writes_what_the_eager_build_writes(
    workers: tuple[WorkerProcess, WorkerProcess, str],
) -> None:
    streaming, eager, sink_url = workers
    start, end = FULL_RANGE
    results = []
    for worker, table in ((streaming, "streamed"), (eager, "eager")):
        final = await run_on(worker, bundle_task(f"t-{table}", start, end, table))
        assert final.state is worker_v1.TaskState.SUCCEEDED, final
        results.append(json.loads(execute_result(final).plugin_results[0].result))
    rows = (end - start + 1) * PER_BLOCK
    assert results == [
        {"table": table, "bundles": 10, "blocks": end - start + 1, "rows": rows}
        for table in ("streamed", "eager")
    ]
    streamed, built = await sink_rows(sink_url, "streamed"), await sink_rows(sink_url, "eager")
    assert streamed == built
    assert len(streamed) == rows
    assert sorted((r["block_number"], r["log_index"]) for r in streamed) == [
        (n, i) for n in range(start, end + 1) for i in range(PER_BLOCK)
    ]
    assert all(r["value"] == transfer_value(r["block_number"], r["log_index"]) for r in streamed)
    assert all(r["block_hash"] == block_hash(r["block_number"]) for r in streamed)
    # The range was read in many chunks of at most BLOCKDB_MAX_ROWS rows.
    reads = counter(streaming.metrics(), "blockx_io_requests", backend="blockdb", op="rows")
    assert reads >= rows / MAX_ROWS


async def test_a_scan_that_fails_midway_fails_the_task_after_some_calls_ran(
    workers: tuple[WorkerProcess, WorkerProcess, str],
) -> None:
    streaming, eager, _ = workers
    # The eager scan's first chunk (1000 blocks) has too many rows and shrinks, the
    # streamed one starts small: either way the gap is found many chunks in.
    start, end = 100, BLOCKS - 1
    finals = {}
    for worker, name in ((streaming, "streamed"), (eager, "eager")):
        final = await run_on(worker, bundle_task(f"t-gap-{name}", start, end, f"gap_{name}"))
        assert final.state is worker_v1.TaskState.FAILED, final
        result = execute_result(final)
        assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", True)
        assert f"block {GAP} is not in the block database yet" in result.failure_message
        finals[name] = final
    # Streamed: the calls of the blocks before the gap ran; eager: none did.
    ran = counter(streaming.metrics(), "blockx_io_requests", backend="memory", op="get")
    assert 0 < ran <= GAP - 1000
    assert counter(eager.metrics(), "blockx_io_requests", backend="memory", op="get") == 0
    # Streamed, the bundles finished before the gap was read are committed (and
    # reported); nothing of the bundle with the gap is. Eager: nothing is written.
    committed = committed_bundles(finals["streamed"], "gap_streamed")
    assert committed
    assert committed[-1][1] < GAP
    await assert_whole_bundles(workers[2], "gap_streamed", committed, first=start)
    assert execute_result(finals["eager"]).plugin_results == []
    assert await sink_rows(workers[2], "gap_eager") == []

    # A range with no matching row runs no call and still covers its blocks.
    final = await run_on(
        streaming, bundle_task("t-none", 0, 10, "none", where={"token": "0x" + "bb" * 20})
    )
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    assert json.loads(execute_result(final).plugin_results[0].result) == {
        "table": "none",
        "bundles": 1,
        "blocks": 11,
        "rows": 0,
    }

    # A read the block database refuses (a column the table lacks) is not retryable.
    final = await run_on(
        streaming, bundle_task("t-bad-where", 0, 10, "never", where={"no_such_column": 1})
    )
    result = execute_result(final)
    assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", False)
    assert "no_such_column" in result.failure_message


async def test_a_failed_call_stops_the_scan(
    workers: tuple[WorkerProcess, WorkerProcess, str],
) -> None:
    streaming, _, _ = workers

    def reads() -> float:
        return counter(streaming.metrics(), "blockx_io_requests", backend="blockdb", op="rows")

    before = reads()
    final = await run_on(
        streaming, bundle_task("t-fails", *FULL_RANGE, "never", function="fails_at_500")
    )
    result = execute_result(final)
    assert (result.failure_code, result.retryable) == ("CALL_FAILED", False)
    assert "block 500 is the bad one" in result.failure_message
    # The scan stopped soon after block 500: far fewer reads than the range needs.
    whole_range = (FULL_RANGE[1] - FULL_RANGE[0] + 1) * PER_BLOCK / MAX_ROWS
    assert reads() - before < 0.75 * whole_range
    # The bundles whose calls had all converged before block 500 failed are
    # committed, whole, and the failed task's plugin result lists them.
    committed = committed_bundles(final, "never")
    assert all(last < 500 for _, last, _, _ in committed)
    await assert_whole_bundles(workers[2], "never", committed, first=FULL_RANGE[0])


async def test_a_worker_killed_between_bundle_commits_leaves_whole_bundles_and_a_rerun_completes(
    workers: tuple[WorkerProcess, WorkerProcess, str],
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    tmp_path: Path,
) -> None:
    sink_url = workers[2]

    def bundle_worker(name: str) -> WorkerProcess:
        return WorkerProcess(
            {
                **worker_env(etcd_server, tmp_path),
                "WORKER_REGISTRY_PREFIX": unique_lane(RegistryKind.BUNDLE),
            },
            tmp_path / f"{name}.log",
            program="blockx-bundle-worker",
        )

    first = bundle_worker("killed")
    await first.wait_ready()
    task = bundle_task("t-killed", *FULL_RANGE, "killed", function="stuck_at_300")
    channel = Channel("127.0.0.1", first.port)
    running = asyncio.create_task(run_to_end(worker_v1.WorkerServiceStub(channel), task))
    try:

        async def a_bundle() -> bool:
            return len(await ledger_blocks(sink_url, "killed")) >= 100

        await wait_until(a_bundle, "a bundle committed", timeout=60)
        first.kill()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        channel.close()
        first.stop()
    # Whole bundles only: each block in the ledger has all its rows, and no block of
    # a bundle whose calls had not all converged is written.
    bundles = len(await ledger_blocks(sink_url, "killed")) // 100
    assert 1 <= bundles <= 3
    committed = [[n, n + 99, 100, 100 * PER_BLOCK] for n in range(0, 100 * bundles, 100)]
    await assert_whole_bundles(sink_url, "killed", committed, first=0)

    # A new Worker runs the task again, with a function that returns the same rows
    # and never sticks: it rewrites the committed bundles and writes the rest.
    again = bundle_worker("again")
    try:
        await again.wait_ready()
        final = await run_on(again, bundle_task("t-killed-again", *FULL_RANGE, "killed"))
    finally:
        again.stop()
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    rows = (FULL_RANGE[1] - FULL_RANGE[0] + 1) * PER_BLOCK
    assert json.loads(execute_result(final).plugin_results[0].result) == {
        "table": "killed",
        "bundles": 10,
        "blocks": 1000,
        "rows": rows,
    }
    assert await ledger_blocks(sink_url, "killed") == list(
        range(*FULL_RANGE[:1], FULL_RANGE[1] + 1)
    )
    written = await sink_rows(sink_url, "killed")
    assert sorted((r["block_number"], r["log_index"]) for r in written) == [
        (n, i) for n in range(FULL_RANGE[1] + 1) for i in range(PER_BLOCK)
    ]
    assert all(r["value"] == transfer_value(r["block_number"], r["log_index"]) for r in written)


@pytest.mark.parametrize("program", ["blockx-worker", "blockx-bundle-worker"])
def test_a_bad_scan_setting_stops_start_up_with_one_line_each(program: str) -> None:
    binary = shutil.which(program)
    assert binary is not None
    env = {
        **os.environ,
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        "SCAN_SLOTS": "0",
        "STREAM_BUILD_ENABLED": "sometimes",
    }
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{program}: invalid configuration: STREAM_BUILD_ENABLED must be true or false "
        "(got 'sometimes')",
        f"{program}: invalid configuration: SCAN_SLOTS must be >= 1 (got 0)",
    ]


@pytest.mark.parametrize(
    ("program", "default"), [("blockx-worker", "false"), ("blockx-bundle-worker", "true")]
)
def test_help_shows_each_workers_stream_build_default(program: str, default: str) -> None:
    binary = shutil.which(program)
    assert binary is not None
    lines = subprocess.run(
        [binary, "--help"], capture_output=True, text=True, timeout=30
    ).stdout.splitlines()
    assert f"  STREAM_BUILD_ENABLED (default: {default})" in lines
    assert "  SCAN_SLOTS (default: 8)" in lines
