"""A real block Worker writing a million rows for one block keeps its etcd lease and
keeps serving: the sink write runs in chunks of SINK_WRITE_CHUNK_ROWS rows inside
its one transaction, and the event loop's other work runs between two chunks. The
Worker's heartbeat key is watched in etcd for the whole write (a lost lease
deletes it), and a neighbouring task submitted while the rows are written
succeeds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aetcd
from chain_rows import CHAIN_ID, block_hash, seed_chain
from processes import WorkerProcess, call_list_task, execute_result, run_to_end, serving

from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_core.registry import worker_key
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

ROWS = 1_000_000
FUNCTIONS = f"""
def many(block):
    return [{{}}] * {ROWS}  # rows of no column of their own: only the writer's stamps

def echo(value):
    return value
"""
BIG = worker_v1.TaskInput(
    task_id="t-million",
    function_call_config=worker_v1.FunctionCallConfig(
        type="BlockTableCallConfig",
        config=json.dumps({"function": "many", "table": "blocks", "block": 1}),
    ),
    result_handler=worker_v1.ResultHandler(
        type="BlockWriteResultHandler", config=json.dumps({"table": "big"})
    ),
)


def all_called(update: worker_v1.TaskUpdate) -> bool:
    progress = update.progress
    return progress is not None and progress.calls_done == progress.calls_total == 1


async def first(
    updates: AsyncIterator[worker_v1.TaskUpdate], wanted: Callable[[worker_v1.TaskUpdate], bool]
) -> worker_v1.TaskUpdate:
    """The first update of the stream that is ``wanted``."""
    async for update in updates:
        if wanted(update):
            return update
    raise AssertionError("the stream ended before the update wanted")


async def test_a_million_rows_for_one_block_keep_the_lease_and_the_neighbours(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    chain_url = f"sqlite:///{tmp_path}/chain.db"
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    await seed_chain(chain_url, 6)
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "big.py").write_text(FUNCTIONS)
    prefix = unique_lane()
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "EXECUTOR_COUNT": "1",
            # The shortest lease a Worker may have: a stalled event loop loses it soonest.
            "WORKER_LEASE_TTL_S": "2",
            "FUNCTIONS_DIR": str(functions),
            "BLOCKDB_URL": chain_url,
            "SINK_DB_URL": sink_url,
        },
        tmp_path / "worker.log",
    )
    heard: list[aetcd.rtypes.EventKind] = []
    async with (
        serving(worker) as (stub,),
        aetcd.Client(etcd_server.host, etcd_server.port, timeout=5) as etcd,
    ):
        watch = await etcd.watch(worker_key(prefix, worker.addr).encode())

        async def listen() -> None:
            async for event in watch:
                heard.append(event.kind)

        listening = asyncio.create_task(listen())
        await stub.submit_task(worker_v1.SubmitTaskRequest(task=BIG))
        updates = stub.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=[BIG.task_id], progress=True)
        ).__aiter__()
        async with asyncio.timeout(120):
            # Every call done and the task still running: its rows are being written.
            update = await first(updates, lambda u: u.is_terminal or all_called(u))
            assert not update.is_terminal, update
            neighbour = await run_to_end(stub, call_list_task("t-echo", "echo", [[7]]))
            assert neighbour.state is worker_v1.TaskState.SUCCEEDED, neighbour
            assert json.loads(execute_result(neighbour).plugin_results[0].result) == [7]
            update = await first(updates, lambda u: u.is_terminal)
        await watch.cancel()
        await listening
    assert update.state is worker_v1.TaskState.SUCCEEDED, update
    written = json.loads(execute_result(update).plugin_results[0].result)
    assert written == {"table": "big", "blocks": 1, "rows": ROWS}
    assert heard, "no heartbeat was published during the write"
    assert aetcd.rtypes.EventKind.DELETE not in heard, heard
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        ledger = await sink.written("big", CHAIN_ID)
    finally:
        await sink.close()
    assert [(w["block_number"], w["block_hash"]) for w in ledger] == [(1, block_hash(1))]
