"""Chain Builders feeding table Writer Plugins on real Workers: a ``blockx-worker``
writes one block's rows per transaction and a ``blockx-bundle-worker`` a bundle's,
into a SQLite sink (SINK_DB_URL) beside the block database; every scanned block
reaches the ledger, and re-running a task leaves the same rows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from chain_rows import CHAIN_ID, block_hash, make_block, seed_chain
from processes import WorkerProcess, execute_result, run_to_end, serving

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_core.registry import RegistryKind
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def seen(row):
    return {"log_index": row["log_index"], "token": row["address"]}

def volume(arg):
    if arg["block"]["block_number"] == 6:
        return None  # a block with no rows still reaches the ledger
    return {"transfers": len(arg["rows"])}
"""
HEAD = 7


def task(
    task_id: str, builder: str, config: dict[str, Any], handler: str, writer: dict[str, Any]
) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(type=builder, config=json.dumps(config)),
        result_handler=worker_v1.ResultHandler(type=handler, config=json.dumps(writer)),
    )


@pytest.fixture
async def cluster(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> AsyncIterator[tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub, str]]:
    chain_url = f"sqlite:///{tmp_path}/chain.db"
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    await seed_chain(chain_url, HEAD + 1)  # blocks 0..HEAD, finalized HEAD - 4
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "writes.py").write_text(FUNCTIONS)
    env = {
        "ETCD_ENDPOINTS": etcd_server.endpoint,
        "FUNCTIONS_DIR": str(functions),
        "BLOCKDB_URL": chain_url,
        "SINK_DB_URL": sink_url,
    }
    block = WorkerProcess({**env, "WORKER_REGISTRY_PREFIX": unique_lane()}, tmp_path / "block.log")
    bundle = WorkerProcess(
        {**env, "WORKER_REGISTRY_PREFIX": unique_lane(RegistryKind.BUNDLE)},
        tmp_path / "bundle.log",
        program="blockx-bundle-worker",
    )
    async with serving(block, bundle) as (block_stub, bundle_stub):
        yield block_stub, bundle_stub, sink_url


async def succeeded(stub: worker_v1.WorkerServiceStub, t: worker_v1.TaskInput) -> Any:
    final = await run_to_end(stub, t, timeout=30)
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    return json.loads(execute_result(final).plugin_results[0].result)


async def sink_contents(url: str, table: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        return await sink.rows(table), await sink.written(table, CHAIN_ID)
    finally:
        await sink.close()


async def test_a_block_task_writes_its_block_and_a_rerun_leaves_the_same_rows(
    cluster: tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub, str],
) -> None:
    block, _, sink_url = cluster
    config = {"function": "seen", "table": "logs", "block": 5, "where": {"topic0": TRANSFER_TOPIC}}
    writer = {"table": "transfers_seen"}
    first = await succeeded(
        block, task("t-w1", "BlockTableCallConfig", config, "BlockWriteResultHandler", writer)
    )
    rows, ledger = await sink_contents(sink_url, "transfers_seen")
    again = await succeeded(
        block, task("t-w2", "BlockTableCallConfig", config, "BlockTableWriteHandler", writer)
    )
    rows_again, ledger_again = await sink_contents(sink_url, "transfers_seen")
    assert first == again == {"table": "transfers_seen", "blocks": 1, "rows": 2}
    expected = [log for log in make_block(5).logs if log.topic0 == TRANSFER_TOPIC]
    assert [(r["block_number"], r["block_hash"], r["log_index"]) for r in rows] == [
        (5, block_hash(5), log.log_index) for log in expected
    ]
    assert rows_again == rows
    assert [(w["block_number"], w["block_hash"], w["task_id"]) for w in ledger] == [
        (5, block_hash(5), "t-w1")
    ]
    assert [w["task_id"] for w in ledger_again] == ["t-w2"]


async def test_a_bundle_task_writes_every_block_it_scanned_by_bundle(
    cluster: tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub, str],
) -> None:
    _, bundle, sink_url = cluster
    config = {
        "function": "volume",
        "table": "erc20_transfers",
        "fromBlock": 0,
        "toBlock": HEAD,
        "bundleSize": 4,
        "unit": "block",
    }
    result = await succeeded(
        bundle,
        task(
            "t-b1",
            "BlockBundleCallConfig",
            config,
            "BlockBundleWriteResultHandler",
            {"table": "volume"},
        ),
    )
    rows, ledger = await sink_contents(sink_url, "volume")
    assert result == {"table": "volume", "bundles": 2, "blocks": HEAD + 1, "rows": HEAD}
    transfers = {n: len(make_block(n).logs) for n in range(HEAD + 1)}
    assert {r["block_number"]: r["transfers"] for r in rows} == {
        n: sum(1 for log in make_block(n).logs if log.topic0 == TRANSFER_TOPIC)
        for n in transfers
        if n != 6
    }
    assert [w["block_number"] for w in ledger] == list(range(HEAD + 1))
    assert all(w["block_hash"] == block_hash(w["block_number"]) for w in ledger)
