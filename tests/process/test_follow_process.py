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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chain_cluster import ChainCluster
from chain_rows import CHAIN_ID, block_hash, seed_chain, shorten_chain
from postgres import PostgresServer, find_postgres_bin
from support import free_port, wait_until

from blockx_chain.devnet import Anvil, Devnet, Reorg
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_client import Client, RetryPolicy, TaskFilter, TaskState
from blockx_core.chains import DEFAULT_CHAIN
from blockx_core.registry import RegistryKind
from blockx_drive import (
    BlockFailed,
    BlockRetrying,
    BlockWritten,
    FollowEvent,
    FollowStarted,
    GapReason,
    JobSpec,
    LedgerReconciled,
    ReorgReconciled,
    WatchInterrupted,
    follow,
)
from blockx_drive.attempts import ClusterUnreachable
from blockx_drive.jobs import STALE_AFTER_MS, JobKind, JobState, LagFrom, list_jobs
from blockx_server.etcd.local import EtcdServer

# Another chain writing the same sink tables.
BASE = 8453
FUNCTIONS = """
def volume(arg):
    return {"transfers": len(arg["rows"]), "seen": arg["block"]["block_hash"]}


def held(arg):
    import time

    time.sleep(600)  # until the call is cancelled


def even_only(arg):
    number = arg["block"]["block_number"]
    if number % 2:
        raise ValueError(f"block {number} is odd")
    return volume(arg)
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
        rows = [r for r in await sink.rows(table) if r["chain_id"] == CHAIN_ID]
        ledger = await sink.written(table, CHAIN_ID)
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
    """``follow`` of ``volume`` into ``table`` in a task of its own, its events
    collected."""

    def __init__(self, client: Client, setup: Setup, table: str, *, push: bool = True) -> None:
        self.events: list[FollowEvent] = []
        self.stop = asyncio.Event()
        events = follow(
            client,
            JobSpec(
                function="volume",
                source_table="erc20_transfers",
                unit="block",
                sink_table=table,
                db_url=setup.chain_url,
                sink_db_url=setup.sink_url,
            ),
            stop=self.stop,
            push=push,
        )
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


class FollowCommand:
    """A ``blockx follow --json`` process, its events read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(
        cls, setup: Setup, table: str, *extra: str, function: str = "volume", **env: str
    ) -> FollowCommand:
        blockx = shutil.which("blockx")
        assert blockx is not None
        argv = [
            *setup.cluster.cli_args(),
            *("follow", "--function", function, "--source-table", "erc20_transfers"),
            *("--unit", "block", "--sink-table", table),
            *("--db", setup.chain_url, "--sink-db", setup.sink_url, "--json", *extra),
        ]
        proc = await asyncio.create_subprocess_exec(
            blockx,
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200", **env},
        )
        return cls(proc)

    async def read_until(self, done: Callable[[], bool]) -> None:
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        async with asyncio.timeout(60):
            while not done():
                line = await self.proc.stdout.readline()
                assert line, (await self.proc.stderr.read()).decode()
                self.events.append(json.loads(line))

    def written(self, number: int, block_hash: str | None = None) -> bool:
        return any(
            e["event"] == "block"
            and e["number"] == number
            and (block_hash is None or e["hash"] == block_hash)
            for e in self.events
        )

    async def interrupt(self) -> tuple[int, str]:
        """SIGINT; the exit code and stderr, its last events read."""
        self.proc.send_signal(signal.SIGINT)
        return await self.finish()

    async def finish(self) -> tuple[int, str]:
        """The exit code and stderr once it ends, its last events read."""
        out, err = await asyncio.wait_for(self.proc.communicate(), 60)
        self.events.extend(json.loads(line) for line in out.decode().splitlines())
        assert self.proc.returncode is not None
        return self.proc.returncode, err.decode()

    async def kill(self) -> None:
        self.proc.kill()
        await self.proc.wait()


@pytest.fixture
def follow_cli(setup: Setup) -> Iterator[Callable[..., Awaitable[FollowCommand]]]:
    """Starts ``blockx follow`` processes; any still running after the test is killed."""
    started: list[FollowCommand] = []

    async def start(table: str, *extra: str, **kw: str) -> FollowCommand:
        command = await FollowCommand.start(setup, table, *extra, **kw)
        started.append(command)
        return command

    yield start
    for command in started:
        if command.proc.returncode is None:
            command.proc.kill()


# Push: ingest subscribes to anvil's newHeads and follow is woken by ingest's
# commits; poll: both poll. The sink must be the canonical chain's either way.
@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
async def test_follow_through_a_reorg_on_anvil_matches_the_canonical_chain(
    setup: Setup, tmp_path: Path, push: bool
) -> None:
    ingest_log = (tmp_path / "ingest.log").open("wb")
    blockx = shutil.which("blockx")
    assert blockx is not None
    table = "volume" if push else "volume_polled"
    feeder = await asyncio.create_subprocess_exec(
        blockx,
        *("chain", "ingest", "--rpc", setup.anvil.url, "--db", setup.chain_url, "--follow"),
        *(() if push else ("--ws", "none")),
        stdout=ingest_log,
        stderr=subprocess.STDOUT,
    )
    following: Following | None = None
    try:
        async with setup.cluster.client() as client, JsonRpcClient(setup.anvil.url) as rpc:
            following = Following(client, setup, table, push=push)
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
                return await matches_chain(setup, table, start, head, holding)

            await wait_until(lambda: caught_up(top), "the sink to reach the head", timeout=60)
            reorg = await net.reorg(3, token_transfers=2, eth_transfers=1)
            new_head = reorg.new_blocks[-1].hash
            await wait_until(
                lambda: caught_up(top, new_head), "the sink to follow the reorg", timeout=60
            )
            _, ledger = await in_sink(setup.sink_url, table)
            assert not {h for _, h in ledger} & set(reorg.old_hashes.values())
            assert {b.hash for b in reorg.new_blocks} <= {h for _, h in ledger}
            await following.close()
    finally:
        if following is not None:
            following.stop.set()
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
    # Lag from when ingest stored each block, which is before follow saw it.
    assert {e.lag_from for e in written} == {LagFrom.INGEST}
    assert all(0 <= e.seen_lag_ms <= e.lag_ms for e in written)


async def test_a_restarted_follow_repairs_what_a_reorg_left_behind(
    setup: Setup, follow_cli: Callable[..., Awaitable[FollowCommand]]
) -> None:
    """Follow stops (a CLI process killed with SIGKILL, then one stopped with SIGINT),
    the chain reorganises by 3 blocks and moves on, and follow restarts without
    --from: the sink holds exactly the canonical rows and ledger hashes."""
    table = "restarted"
    chain_url = parse_blockdb_url(setup.chain_url)
    async with JsonRpcClient(setup.anvil.url) as rpc:
        net = Devnet(rpc)
        await net.setup(tokens=1, reorgable=True)
        await net.mine(4, token_transfers=2, eth_transfers=0, reorgable=True)
        await ingest(setup.anvil.url, chain_url, IngestOptions())
        _, top = await canonical(setup.chain_url, 0)
        start = top - 4

        async def reorganise() -> tuple[Reorg, int]:
            """Reorg the top 3 blocks, mine 2 more, ingest it all."""
            reorg = await net.reorg(3, token_transfers=1, eth_transfers=0)
            await net.mine(2, token_transfers=1, eth_transfers=0, reorgable=True)
            await ingest(setup.anvil.url, chain_url, IngestOptions())
            _, head = await canonical(setup.chain_url, 0)
            return reorg, head

        killed = await follow_cli(table, "--from", str(start))
        await killed.read_until(lambda: killed.written(top))
        await killed.kill()
        # Its record outlives it: still running, read as interrupted once stale.
        sink_url = parse_blockdb_url(setup.sink_url)
        [dead] = await list_jobs(sink_url, job_id=killed.events[0]["job_id"])
        assert (dead.state, dead.ended_ms, dead.sink_table) == (JobState.RUNNING, None, table)
        assert dead.shown_state(dead.updated_ms + STALE_AFTER_MS + 1) is JobState.INTERRUPTED
        first, top = await reorganise()

        restarted = await follow_cli(table)
        await wait_until(
            lambda: matches_chain(setup, table, start, top),
            "the restart to repair the sink",
            timeout=60,
        )
        code, err = await restarted.interrupt()
        assert code == 0, err
        second, top = await reorganise()

        async with setup.cluster.client() as client:
            following = Following(client, setup, table)

            async def repaired() -> bool:
                following.check()
                return await matches_chain(setup, table, start, top)

            await wait_until(repaired, "the Python API's restart to repair the sink", timeout=60)
            await following.close()
    # Each restart said what it found: the 3 abandoned blocks, rewritten.
    api_events = [msgspec.json.decode(msgspec.json.encode(e)) for e in following.events]
    for run, reorg in ((restarted.events, first), (api_events, second)):
        [reconciled] = [e for e in run if e["event"] == "reconcile"]
        assert reconciled["reason"] == "start"
        assert set(reconciled["rewritten"]) == set(reorg.old_hashes)
        assert reconciled["deleted"] == []
        assert reconciled["checked"] >= 5
    _, ledger = await in_sink(setup.sink_url, table)
    assert not {h for _, h in ledger} & (
        set(first.old_hashes.values()) | set(second.old_hashes.values())
    )
    # Every run is a record of its own: the killed one as it was left, the others
    # ended as they were stopped, each naming what started it.
    records = {j.job_id: j for j in await list_jobs(sink_url) if j.sink_table == table}
    assert records[dead.job_id] == dead
    cli_run, api_run = records[restarted.events[0]["job_id"]], records[api_events[0]["job_id"]]
    assert (cli_run.state, api_run.state) == (JobState.STOPPED, JobState.STOPPED)
    assert "follow --function volume" in cli_run.command
    assert api_run.command.startswith("follow(function='volume', source_table='erc20_transfers'")


async def test_a_shorter_branch_deletes_the_blocks_above_its_head(
    setup: Setup, follow_cli: Callable[..., Awaitable[FollowCommand]]
) -> None:
    sink_url = parse_blockdb_url(setup.sink_url)
    store = await open_store(parse_blockdb_url(setup.chain_url))
    try:
        head = await store.head()
        assert head is not None
        top = head["number"]
        start = top - 5
        # Another chain's rows of the same table and block numbers, which stay.
        base = [
            (n, f"0xba5e{n}", [{"transfers": -n, "seen": "base"}]) for n in range(start, top + 1)
        ]
        sink = await open_sink(sink_url)
        try:
            await sink.replace_blocks("short", BASE, base)
        finally:
            await sink.close()
        follower = await follow_cli("short", "--from", str(start), "--chain", DEFAULT_CHAIN)
        await follower.read_until(lambda: follower.written(top))
        assert await matches_chain(setup, "short", start, top)
        job_id = follower.events[0]["job_id"]

        async def recorded_top() -> bool:
            return [j.last_block for j in await list_jobs(sink_url, job_id=job_id)] == [top]

        await wait_until(recorded_top, "the follow's job record at the head")
        [running] = await list_jobs(sink_url, job_id=job_id)
        assert (running.kind, running.state, running.sink_table, running.head_lag_blocks) == (
            JobKind.FOLLOW,
            JobState.RUNNING,
            "short",
            0,
        )
        assert (running.lag_from, running.blocks_done) == (LagFrom.INGEST, top - start + 1)
        assert (running.chain, running.chain_id) == (DEFAULT_CHAIN, CHAIN_ID)

        # A reorg the way ingest applies one, in one transaction: drop the blocks
        # above the fork, record it, write the new branch: one block, so two fewer.
        fork = top - 3
        new_block = await shorten_chain(store, fork=fork, depth=3, old_head_hash=head["hash"])
        await follower.read_until(lambda: follower.written(fork + 1, new_block.block.block_hash))
        code, err = await follower.interrupt()
        assert code == 0, err
        assert "Traceback" not in err
    finally:
        await store.close()
    events = follower.events
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
    sink = await open_sink(sink_url)
    try:
        kept = [r for r in await sink.rows("short") if r["chain_id"] == BASE]
        assert [(r["block_number"], r["transfers"]) for r in kept] == [
            (n, -n) for n in range(start, top + 1)
        ]
        assert len(await sink.written("short", BASE)) == len(base)
    finally:
        await sink.close()
    assert events[1] == {
        "event": "reconcile",
        "reason": "start",
        "from_block": None,
        "to_block": None,
        "checked": 0,
        "rewritten": [],
        "deleted": [],
    }
    assert {e["event"] for e in events} <= {
        "start",
        "reconcile",
        "block",
        "retry",
        "reorg",
        "deleted",
    }
    [stopped] = await list_jobs(sink_url, job_id=job_id)
    assert stopped.state is JobState.STOPPED
    # The new branch's block was stored without an ingest time (not by ingest):
    # its lag is from when follow saw it, and says so.
    [rewritten] = [e for e in events if e["event"] == "block" and e["number"] == fork + 1][-1:]
    assert (rewritten["hash"], rewritten["lag_from"]) == (new_block.block.block_hash, "follow")


async def test_a_block_that_fails_for_good_is_reported_and_never_passes_for_written(
    setup: Setup, follow_cli: Callable[..., Awaitable[FollowCommand]]
) -> None:
    _, top = await canonical(setup.chain_url, 0)
    start = top - 3
    odd = [n for n in range(start, top + 1) if n % 2]
    # Going on (the default): the other blocks are written, the exit code is 1.
    going_on = await follow_cli("odd", "--from", str(start), function="even_only")
    await going_on.read_until(
        lambda: (
            {e.get("number") for e in going_on.events if e["event"] in ("block", "failed")}
            == set(range(start, top + 1))
        )
    )
    code, err = await going_on.interrupt()
    assert code == 1, err
    failed = [e for e in going_on.events if e["event"] == "failed"]
    assert sorted(e["number"] for e in failed) == odd
    # Not retryable: one attempt each, never resubmitted.
    assert {(e["attempt"], e["failure_code"]) for e in failed} == {(1, "CALL_FAILED")}
    assert not [e for e in going_on.events if e["event"] == "retry"]
    assert f"2 blocks failed for good and were not written ({odd[0]}, {odd[1]})" in err
    assert "is odd" in err
    assert "Traceback" not in err
    rows, _ = await in_sink(setup.sink_url, "odd")
    assert [n for n, _, _ in rows] == [n for n in range(start, top + 1) if not n % 2]

    # Stopping: follow ends by itself once a block failed (the blocks under way
    # then are still reported), exit code 1.
    stopping = await follow_cli(
        "odd_stop",
        *("--from", str(start), "--on-failure", "stop", "--max-attempts", "3"),
        function="even_only",
    )
    code, err = await stopping.finish()
    assert code == 1, err
    assert {e["number"] for e in stopping.events if e["event"] == "failed"} <= set(odd)
    assert "after 1 attempts: CALL_FAILED: call #0 even_only(" in err


async def test_sigint_cancels_the_task_in_flight_and_stops_at_once(
    setup: Setup, follow_cli: Callable[..., Awaitable[FollowCommand]]
) -> None:
    """Ctrl-C cancels the block's task in flight on the Worker, says so, and follow
    stops without waiting for it: a block cancelled so is not a failure (exit 0),
    it is left for the next run."""
    _, top = await canonical(setup.chain_url, 0)
    held = TaskFilter(function="held")
    following = await follow_cli("held", "--from", str(top), function="held")
    async with setup.cluster.client() as client:

        async def running() -> bool:
            assert following.proc.returncode is None
            found = await client.list_tasks(held, workers=[setup.cluster.worker.addr])
            return [t.state for t in found.tasks] == [TaskState.RUNNING]

        await wait_until(running, "the block's task running", timeout=60)
        code, err = await following.interrupt()
        assert code == 0, err
        assert "interrupted: cancelling 1 task(s) in flight on their workers" in err
        [task] = (await client.list_tasks(held, workers=[setup.cluster.worker.addr])).tasks
    assert (task.state, task.failure_code) == (TaskState.FAILED, "CANCELLED")
    assert {e["event"] for e in following.events} == {"start", "reconcile"}


async def test_a_block_whose_attempts_never_reach_the_cluster_ends_follow(setup: Setup) -> None:
    _, top = await canonical(setup.chain_url, 0)
    # Each attempt gives up on the unreachable coordinator after 0.5 s, not 10.
    nowhere, patience = f"127.0.0.1:{free_port()}", RetryPolicy(unreachable_s=0.5)
    seen: list[FollowEvent] = []
    async with Client(coordinator=nowhere, retry=patience) as client:
        events = follow(
            client,
            JobSpec(
                function="volume",
                source_table="erc20_transfers",
                sink_table="unreached",
                db_url=setup.chain_url,
                sink_db_url=setup.sink_url,
                max_attempts=2,
            ),
            from_block=top,
        )

        async def consume() -> None:
            async with asyncio.timeout(60):
                async for event in events:
                    seen.append(event)

        with pytest.raises(ClusterUnreachable, match="2 attempts and the cluster never answered"):
            await consume()
    assert [type(e) for e in seen] == [
        FollowStarted,
        LedgerReconciled,
        BlockRetrying,
        BlockFailed,
    ]


async def test_a_block_database_that_goes_away_is_waited_for_then_the_ledger_reconciled(
    tmp_path: Path,
) -> None:
    """Follow's own watching has a gap: its block database (PostgreSQL) stops and
    comes back. Follow waits instead of ending, and once it can read again compares
    its ledger with the chain: a block written meanwhile above the head goes, and
    another chain's rows of the same table and block numbers stay."""
    bin_dir = find_postgres_bin()
    assert bin_dir is not None, "PostgreSQL is not installed: run scripts/setup.sh"
    server = PostgresServer(bin_dir)
    server.start()
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        await seed_chain(server.url(), 12)
        written = [(n, block_hash(n), [{"v": n}]) for n in range(8, 12)]
        await sink.replace_blocks("gap", CHAIN_ID, written)
        base = [(n, block_hash(n, branch=2), [{"v": -n}]) for n in range(8, 13)]
        await sink.replace_blocks("gap", BASE, base)
        # No block is submitted: the ledger is up to date and the chain does not move.
        async with Client(coordinator="127.0.0.1:1") as client:
            events = follow(
                client,
                JobSpec(
                    function="volume",
                    source_table="erc20_transfers",
                    sink_table="gap",
                    db_url=server.url(),
                    sink_db_url=sink_url,
                ),
            )
            seen: list[FollowEvent] = []

            async def until(done: Callable[[FollowEvent], bool]) -> FollowEvent:
                async with asyncio.timeout(60):
                    async for event in events:
                        seen.append(event)
                        if done(event):
                            return event
                raise AssertionError(f"follow ended: {seen}")

            await until(lambda e: isinstance(e, LedgerReconciled))
            server.stop_server()
            await until(lambda e: isinstance(e, WatchInterrupted))
            # Written while follow could not look: a block the chain does not hold.
            elsewhere = [(12, block_hash(12, branch=1), [{"v": 12}])]
            await sink.replace_blocks("gap", CHAIN_ID, elsewhere)
            server.start_server()
            reconciled = await until(lambda e: isinstance(e, LedgerReconciled))
            await events.aclose()  # type: ignore[attr-defined]
        assert reconciled == LedgerReconciled(
            reason=GapReason.UNREACHABLE,
            from_block=8,
            to_block=12,
            checked=5,
            rewritten=(),
            deleted=(12,),
        )
        assert [w["block_number"] for w in await sink.written("gap", CHAIN_ID)] == [8, 9, 10, 11]
        assert [w["block_number"] for w in await sink.written("gap", BASE)] == list(range(8, 13))
        assert sorted((r["chain_id"], r["v"]) for r in await sink.rows("gap")) == sorted(
            [(CHAIN_ID, n) for n in range(8, 12)] + [(BASE, -n) for n in range(8, 13)]
        )
    finally:
        await sink.close()
        server.stop()
