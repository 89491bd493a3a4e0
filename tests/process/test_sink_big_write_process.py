"""A real block Worker writing a million rows for one block keeps its etcd lease and
keeps serving: the sink write runs off its event loop, in chunks of
SINK_WRITE_CHUNK_ROWS rows inside its one transaction. Its heartbeat key is watched
in etcd for the whole write (a lost lease deletes it), and a neighbouring task
submitted while the rows are written succeeds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aetcd
from chain_cluster import ChainCluster
from chain_rows import block_hash, seed_chain

from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_client import CallProgress, PluginConfig, Task, TaskState
from blockx_core.registry import RegistryKind, worker_key
from blockx_server.etcd.local import EtcdServer

ROWS = 1_000_000
FUNCTIONS = f"""
def many(block):
    return [{{"i": i}} for i in range({ROWS})]

def echo(value):
    return value
"""


async def test_a_million_rows_for_one_block_keep_the_lease_and_the_neighbours(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    chain_url = f"sqlite:///{tmp_path}/chain.db"
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    await seed_chain(chain_url, 6)
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "big.py").write_text(FUNCTIONS)
    cluster = ChainCluster(
        etcd_server,
        tmp_path,
        RegistryKind.BLOCK,
        chain_url=chain_url,
        sink_url=sink_url,
        functions=functions,
        # The shortest lease a Worker may have: a stalled event loop loses it soonest.
        WORKER_LEASE_TTL_S="2",
    )
    key = worker_key(cluster.prefix, cluster.worker.addr).encode()
    try:
        await cluster.wait_ready()
        async with aetcd.Client(etcd_server.host, etcd_server.port, timeout=5) as etcd:
            watch = await etcd.watch(key)
            heard: list[aetcd.rtypes.EventKind] = []

            async def listen() -> None:
                async for event in watch:
                    heard.append(event.kind)

            listening = asyncio.create_task(listen())
            async with cluster.client() as client:
                called = asyncio.Event()

                def progress(update: CallProgress) -> None:
                    if update.calls_done == update.calls_total == 1:
                        called.set()  # the rows are the Writer's now

                big = asyncio.create_task(
                    client.run(
                        Task(
                            function_call_config=PluginConfig(
                                type="BlockTableCallConfig",
                                config={"function": "many", "table": "blocks", "block": 1},
                            ),
                            result_handler=PluginConfig(
                                type="BlockWriteResultHandler", config={"table": "big"}
                            ),
                        ),
                        on_progress=progress,
                    )
                )
                await asyncio.wait_for(called.wait(), 60)
                neighbour = await client.run(Task.call_list("echo", [[7]]))
                assert neighbour.state is TaskState.SUCCEEDED, neighbour
                assert neighbour.outputs() == [7]
                written = await asyncio.wait_for(big, 120)
            await watch.cancel()
            await listening
        assert written.state is TaskState.SUCCEEDED, written
        assert written.plugin_results[0].value() == {"table": "big", "blocks": 1, "rows": ROWS}
        assert aetcd.rtypes.EventKind.DELETE not in heard, heard
        assert heard, "no heartbeat was published during the write"
    finally:
        cluster.stop()
    assert "Traceback" not in cluster.worker.output()
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        ledger = await sink.written("big")
    finally:
        await sink.close()
    assert [(w["block_number"], w["block_hash"]) for w in ledger] == [(1, block_hash(1))]
