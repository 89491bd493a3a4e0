"""``blockx follow`` on a real block cluster (a ``blockx-coordinator`` and a
``blockx-worker`` over a SQLite block database and sink): fed by a real anvil and a
real ``blockx chain ingest --follow``, every new block is computed into the sink,
and after a reorg the sink rows match the canonical chain exactly; a reorg to a
shorter branch (applied through the store the way ingest applies one) deletes the
rows of the blocks above its head. The CLI prints one JSON object per event and
stops cleanly on SIGINT."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_cluster import ChainCluster
from chain_rows import make_block
from support import wait_until

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_client.follow import (
    BlockWritten,
    FollowEvent,
    FollowStarted,
    ReorgReconciled,
    follow,
)
from blockx_client.jobs import JOBS_PREFIX, JobKind, JobProgress, JobState, list_jobs
from blockx_core.registry import RegistryKind
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def volume(arg):
    return {"transfers": len(arg["rows"]), "seen": arg["block"]["block_hash"]}
"""


class Setup:
    def __init__(self, cluster: ChainCluster, anvil: Anvil, chain_url: str, sink_url: str) -> None:
        self.cluster = cluster
        self.anvil = anvil
        self.chain_url = chain_url
        self.sink_url = sink_url


@pytest.fixture(scope="module")
def setup(
    etcd_server: EtcdServer, anvil: Anvil, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("follow")
    chain_url = f"sqlite:///{root}/chain.db"
    sink_url = f"sqlite:///{root}/sink.db"

    async def chain() -> None:
        async with JsonRpcClient(anvil.url) as rpc:
            net = Devnet(rpc)
            await net.setup(tokens=2)
            await net.mine(16, token_transfers=3, eth_transfers=1)
        await ingest(anvil.url, parse_blockdb_url(chain_url), IngestOptions())

    asyncio.run(chain())
    functions = root / "functions"
    functions.mkdir()
    (functions / "volume.py").write_text(FUNCTIONS)
    cluster = ChainCluster(
        etcd_server,
        root,
        RegistryKind.BLOCK,
        chain_url=chain_url,
        sink_url=sink_url,
        functions=functions,
    )
    with cluster.serving():
        yield Setup(cluster, anvil, chain_url, sink_url)


async def canonical(chain_url: str, start: int) -> tuple[list[tuple[Any, ...]], int]:
    """What the sink must hold from ``start``, computed from the block database
    directly: one row per block, its ERC-20 transfer count; and the head."""
    store = await open_store(parse_blockdb_url(chain_url))
    try:
        head = await store.head()
        assert head is not None
        blocks = await store.blocks(start, head["number"])
        expected = [
            (
                b["block_number"],
                b["block_hash"],
                len(await store.erc20_transfers(b["block_number"])),
            )
            for b in blocks
        ]
    finally:
        await store.close()
    return expected, head["number"]


async def in_sink(sink_url: str, table: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        rows = await sink.rows(table)
        ledger = await sink.written(table)
    finally:
        await sink.close()
    assert all(r["seen"] == r["block_hash"] for r in rows)
    return (
        [(r["block_number"], r["block_hash"], r["transfers"]) for r in rows],
        [(w["block_number"], w["block_hash"]) for w in ledger],
    )


async def matches_chain(
    setup: Setup, table: str, start: int, head_at_least: int, holding: str | None = None
) -> bool:
    """The sink holds what the chain says, once the block database's head is at
    least ``head_at_least`` (and it holds the block hashed ``holding``)."""
    expected, head = await canonical(setup.chain_url, start)
    if head < head_at_least or (holding is not None and holding not in {h for _, h, _ in expected}):
        return False
    rows, ledger = await in_sink(setup.sink_url, table)
    return rows == expected and ledger == [(n, h) for n, h, _ in expected]


class Following:
    """``follow`` in a task of its own, its events collected."""

    def __init__(self, events: AsyncIterator[FollowEvent], stop: asyncio.Event) -> None:
        self.events: list[FollowEvent] = []
        self.stop = stop
        self._task = asyncio.create_task(self._collect(events))

    async def _collect(self, events: AsyncIterator[FollowEvent]) -> None:
        async for event in events:
            self.events.append(event)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self._task, 60)

    def check(self) -> None:
        if self._task.done():
            self._task.result()
            raise AssertionError("follow ended by itself")


async def test_follow_through_a_reorg_on_anvil_matches_the_canonical_chain(
    setup: Setup, tmp_path: Path
) -> None:
    ingest_log = (tmp_path / "ingest.log").open("wb")
    blockx = shutil.which("blockx")
    assert blockx is not None
    feeder = await asyncio.create_subprocess_exec(
        blockx,
        *("chain", "ingest", "--rpc", setup.anvil.url, "--db", setup.chain_url, "--follow"),
        stdout=ingest_log,
        stderr=subprocess.STDOUT,
    )
    stop = asyncio.Event()
    try:
        async with setup.cluster.client() as client, JsonRpcClient(setup.anvil.url) as rpc:
            following = Following(
                follow(
                    client,
                    function="volume",
                    source_table="erc20_transfers",
                    unit="block",
                    sink_table="volume",
                    db_url=setup.chain_url,
                    sink_db_url=setup.sink_url,
                    poll_interval_s=0.1,
                    stop=stop,
                ),
                stop,
            )
            await wait_until(lambda: bool(following.events), "follow to start", timeout=20)
            started = following.events[0]
            assert isinstance(started, FollowStarted)
            assert started.head is not None
            start = started.from_block
            assert start == started.head  # an empty ledger: from the head on

            net = Devnet(rpc)
            await net.setup(tokens=2, reorgable=True)
            mined = await net.mine(5, token_transfers=3, eth_transfers=1, reorgable=True)
            top = mined[-1].number

            async def caught_up(head: int, holding: str | None = None) -> bool:
                following.check()
                return await matches_chain(setup, "volume", start, head, holding)

            await wait_until(lambda: caught_up(top), "the sink to reach the head", timeout=60)
            reorg = await net.reorg(3, token_transfers=2, eth_transfers=1)
            new_head = reorg.new_blocks[-1].hash
            await wait_until(
                lambda: caught_up(top, new_head), "the sink to follow the reorg", timeout=60
            )
            _, ledger = await in_sink(setup.sink_url, "volume")
            assert not {h for _, h in ledger} & set(reorg.old_hashes.values())
            assert {b.hash for b in reorg.new_blocks} <= {h for _, h in ledger}
            await following.close()
    finally:
        stop.set()
        feeder.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(feeder.wait(), 30) == 0
        ingest_log.close()
    reorgs = [e for e in following.events if isinstance(e, ReorgReconciled)]
    assert [(r.fork_block_number, r.depth) for r in reorgs] == [(reorg.fork_block_number, 3)]
    # Each abandoned block the sink held was rewritten on the new branch or deleted
    # (then written again when the new branch reached the database).
    touched = set(reorgs[0].rewritten) | set(reorgs[0].deleted)
    assert touched == set(reorg.old_hashes)
    written = [e for e in following.events if isinstance(e, BlockWritten)]
    assert {e.number for e in written} == set(range(start, top + 1))
    assert all(e.lag_ms >= 0 and e.seen_lag_ms >= 0 for e in written)


async def test_a_shorter_branch_deletes_the_blocks_above_its_head(
    setup: Setup, etcd_server: EtcdServer
) -> None:
    jobs_prefix = f"{JOBS_PREFIX}{JobKind.FOLLOW.value}/"
    before = {j.job_id for j in await list_jobs([etcd_server.endpoint], prefix=jobs_prefix)}

    async def this_job() -> JobProgress | None:
        found = await list_jobs([etcd_server.endpoint], prefix=jobs_prefix)
        return next((j for j in found if j.job_id not in before), None)

    store = await open_store(parse_blockdb_url(setup.chain_url))
    try:
        head = await store.head()
        assert head is not None
        top = head["number"]
        start = top - 5
        blockx = shutil.which("blockx")
        assert blockx is not None
        argv = [
            *setup.cluster.cli_args(),
            "follow",
            "--function",
            "volume",
            "--source-table",
            "erc20_transfers",
            "--unit",
            "block",
            "--sink-table",
            "short",
            "--from",
            str(start),
            "--db",
            setup.chain_url,
            "--sink-db",
            setup.sink_url,
            "--json",
        ]
        proc = await asyncio.create_subprocess_exec(
            blockx,
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200", "ETCD_ENDPOINTS": etcd_server.endpoint},
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        events: list[dict[str, Any]] = []

        async def read_until(done: Any) -> None:
            async with asyncio.timeout(60):
                while not done():
                    line = await proc.stdout.readline()  # type: ignore[union-attr]
                    assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
                    events.append(json.loads(line))

        def written(number: int, block_hash: str | None = None) -> bool:
            return any(
                e["event"] == "block"
                and e["number"] == number
                and (block_hash is None or e["hash"] == block_hash)
                for e in events
            )

        await read_until(lambda: written(top))
        assert await matches_chain(setup, "short", start, top)

        async def published_top() -> bool:
            job = await this_job()
            return job is not None and job.last_block == top

        await wait_until(published_top, "the follow's job record at the head")
        running = await this_job()
        assert running is not None
        assert (running.state, running.sink_table, running.head_lag_blocks) == (
            JobState.RUNNING,
            "short",
            0,
        )
        assert running.lag_ms is not None
        assert running.blocks_done == top - start + 1

        # A reorg the way ingest applies one, in one transaction: drop the blocks
        # above the fork, record it, write the new branch: one block, so two fewer.
        fork = top - 3
        new_block = make_block(fork + 1, branch=9)
        chain = await store.chain()
        assert chain is not None
        async with store.writer() as w:
            await w.delete_above(fork)
            await w.record_reorg(
                detected_at_ms=0,
                fork_block_number=fork,
                depth=3,
                old_head_hash=head["hash"],
                new_head_hash=new_block.block.block_hash,
            )
            await w.insert_blocks([new_block])
            await w.set_chain(
                head_number=fork + 1,
                head_hash=new_block.block.block_hash,
                finalized_number=chain.finalized_number,
                epoch=chain.epoch,
            )
        await read_until(lambda: written(fork + 1, new_block.block.block_hash))
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        events.extend(json.loads(line) for line in out.decode().splitlines())
        assert proc.returncode == 0, err.decode()
        assert "Traceback" not in err.decode()
    finally:
        await store.close()
    assert events[0]["event"] == "start"
    assert events[0]["from_block"] == start
    [reorg] = [e for e in events if e["event"] == "reorg"]
    assert (reorg["fork_block_number"], reorg["depth"]) == (fork, 3)
    assert (reorg["rewritten"], reorg["deleted"]) == ([fork + 1], [fork + 2, fork + 3])
    rows, ledger = await in_sink(setup.sink_url, "short")
    expected, new_head = await canonical(setup.chain_url, start)
    assert new_head == fork + 1
    assert rows == expected
    assert ledger == [(n, h) for n, h, _ in expected]
    assert {e["event"] for e in events} <= {"start", "block", "retry", "reorg", "deleted"}
    stopped = await this_job()
    assert stopped is not None
    assert stopped.state is JobState.DONE
