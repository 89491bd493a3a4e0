"""The demo's live stage: anvil mines, ingest follows, the block cluster writes each block.

Three loops run side by side for ``seconds``:

* ``LiveChain`` mines a block of transfers every ``block_time_s`` (with a snapshot
  before each, so the Devnet can fork there) and, part-way, abandons the top
  ``reorg_depth`` blocks for a new branch of as many;
* an ingest follows the node's head into the block database;
* ``BlockFollower``, the part ``client.follow`` does for a user, watches the
  block database: every block whose hash it has not submitted yet (a new block,
  or a block of the new branch after a reorg) gets a ``BlockTableCallConfig``
  task pinned to that hash, on the block cluster. A task of a block reorged away
  fails (its hash is no longer canonical) and is counted as superseded: the
  block's new hash has its own task.

When mining stops the stage waits until ingest holds the node's head and every
task has ended, then compares the sink's ledger with the canonical chain and
resubmits any block whose written hash is not canonical (a write that raced a
reorg), as a follower reconciles.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, Final

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from blockx_chain.devnet import Devnet, Reorg
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.sink import open_sink
from blockx_chain.store import BlockStore, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.demo.chain import Transfers
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_client import Client, TaskResult

_POLL_S: Final = 0.05
# Blocks below the head the submitter re-reads each poll to notice a reorg.
_WINDOW: Final = 16
_SETTLE_TIMEOUT_S: Final = 20.0
MAX_ATTEMPTS: Final = 3


class LiveFigures(msgspec.Struct, kw_only=True):
    first_block: int
    head: int = -1
    mined: dict[str, int] = msgspec.field(default_factory=dict)  # block hash -> ms mined
    reorg: Reorg | None = None
    # Every hash a task wrote, by block number (a reorged block has two).
    written_hashes: dict[int, list[str]] = msgspec.field(default_factory=dict)
    reorgs_seen: list[dict[str, Any]] = msgspec.field(default_factory=list)
    tasks: int = 0
    written: int = 0
    superseded: int = 0
    reconciled: int = 0
    failed: list[str] = msgspec.field(default_factory=list)
    seconds: float = 0.0


class LiveChain:
    """The chain side: mines live blocks on the Devnet, with one reorg part-way."""

    def __init__(self, devnet: Devnet, transfers: Transfers, figures: LiveFigures) -> None:
        self.devnet = devnet
        self.transfers = transfers
        self.figures = figures
        self.node_head = -1

    async def run(self, seconds: float, block_time_s: float, reorg_depth: int) -> None:
        deadline = time.monotonic() + seconds
        reorg_at = time.monotonic() + seconds * 0.6
        mined = 0
        while time.monotonic() < deadline:
            tick = time.monotonic()
            due = reorg_depth > 0 and self.figures.reorg is None and tick >= reorg_at
            if due and mined > reorg_depth:
                reorg = await self.transfers.reorg(self.devnet, reorg_depth)
                now_ms = time.time_ns() // 1_000_000
                for block in reorg.new_blocks:
                    self.figures.mined[block.hash] = now_ms
                self.figures.reorg = reorg
                self.node_head = reorg.new_blocks[-1].number
            else:
                [block] = await self.transfers.mine(self.devnet, 1, reorgable=True)
                self.figures.mined[block.hash] = time.time_ns() // 1_000_000
                self.node_head = block.number
                mined += 1
            await asyncio.sleep(max(0.0, block_time_s - (time.monotonic() - tick)))


class BlockFollower:
    """The client side: a block-cluster task per new block hash in the block
    database, from ``figures.first_block`` on."""

    def __init__(
        self, client: Client, job: ChainJob, store: BlockStore, figures: LiveFigures
    ) -> None:
        self.client = client
        self.job = job
        self.store = store
        self.figures = figures
        self.submitted: dict[int, str] = {}
        self.runs: set[asyncio.Task[None]] = set()
        self.in_flight: set[int] = set()  # block numbers with a task under way
        self.recent: list[tuple[int, str, str, str]] = []  # number, hash, outcome, lag
        self.ingested = -1
        self.run_id = f"demo-{os.getpid()}-live"

    async def poll(self) -> None:
        head = await self.store.head()
        if head is None:
            return
        self.ingested = head["number"]
        low = max(self.figures.first_block, self.ingested - _WINDOW)
        if low <= self.ingested:
            for row in await self.store.blocks(low, self.ingested):
                number, block_hash = row["block_number"], row["block_hash"]
                if self.submitted.get(number) != block_hash:
                    self.submit(number, block_hash)
        cursor = self.figures.reorgs_seen[-1]["id"] if self.figures.reorgs_seen else 0
        self.figures.reorgs_seen += await self.store.reorgs(after_id=cursor)

    def submit(self, number: int, block_hash: str) -> None:
        self.submitted[number] = block_hash
        run = asyncio.create_task(self._run_block(number, block_hash))
        self.runs.add(run)
        run.add_done_callback(self.runs.discard)

    async def _run_block(self, number: int, block_hash: str) -> None:
        self.in_flight.add(number)
        try:
            await self._attempts(number, block_hash)
        finally:
            self.in_flight.discard(number)

    async def _attempts(self, number: int, block_hash: str) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            task_id = f"{self.run_id}-{number}-{block_hash[2:10]}-{attempt}"
            self.figures.tasks += 1
            result = await self.client.run(self.job.block_task(number, block_hash, task_id))
            if result.ok:
                self.figures.written += 1
                self.figures.written_hashes.setdefault(number, []).append(block_hash)
                self._show(number, block_hash, "written")
                return
            if self.submitted.get(number) != block_hash:
                self.figures.superseded += 1
                self._show(number, block_hash, "reorged away")
                return
            if not result.retryable or attempt == MAX_ATTEMPTS:
                self.figures.failed.append(_failure(result))
                self._show(number, block_hash, result.failure_code or result.state.value)
                return

    def _show(self, number: int, block_hash: str, outcome: str) -> None:
        mined = self.figures.mined.get(block_hash)
        lag = "" if mined is None else f"{time.time_ns() // 1_000_000 - mined} ms"
        self.recent = [*self.recent[-7:], (number, block_hash, outcome, lag)]

    async def settle(self, node_head: int, sink_db_url: str) -> None:
        """Wait for ingest to hold ``node_head`` and for every task to end; then
        resubmit what the sink holds under a hash that is not canonical."""
        deadline = time.monotonic() + _SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            await self.poll()
            if self.ingested >= node_head and not self.runs:
                break
            await asyncio.sleep(_POLL_S)
        canonical = {
            row["block_number"]: row["block_hash"]
            for row in await self.store.blocks(self.figures.first_block, self.ingested)
        }
        sink = await open_sink(parse_blockdb_url(sink_db_url))
        try:
            written = await sink.written(self.job.sink_table)
            ledger = {w["block_number"]: w["block_hash"] for w in written}
        finally:
            await sink.close()
        for number, block_hash in canonical.items():
            if ledger.get(number) != block_hash and number not in self.in_flight:
                self.figures.reconciled += 1
                self.submit(number, block_hash)
        if self.runs:
            await asyncio.wait(set(self.runs), timeout=max(deadline - time.monotonic(), 1.0))
        self.figures.head = self.ingested

    async def close(self) -> None:
        for run in list(self.runs):
            run.cancel()
        await asyncio.gather(*self.runs, return_exceptions=True)


def _view(chain: LiveChain, follower: BlockFollower, started: float) -> Group:
    table = Table(title="live blocks (block cluster)", expand=False)
    for column in ("block", "hash", "outcome", "mined → written"):
        table.add_column(column, justify="right" if column == "block" else "left")
    for number, block_hash, outcome, lag in follower.recent:
        style = "yellow" if outcome == "reorged away" else ""
        table.add_row(str(number), block_hash[:12] + "…", outcome, lag, style=style)
    f = follower.figures
    status = Text(
        f"  {time.monotonic() - started:4.1f} s  node head {chain.node_head}  "
        f"ingested {follower.ingested}  tasks {f.tasks}  written {f.written}  "
        f"superseded {f.superseded}  reorgs seen by ingest {len(f.reorgs_seen)}"
    )
    lines: list[Any] = [table, status]
    for reorg in f.reorgs_seen:
        lines.append(
            Text(
                f"  reorg: ingest dropped the blocks above {reorg['fork_block_number']} "
                f"(depth {reorg['depth']}); their new hashes are being written",
                style="bold yellow",
            )
        )
    return Group(*lines)


def _failure(result: TaskResult) -> str:
    return f"{result.task_id}: {result.failure_code} {result.failure_message}"


async def live_stage(
    client: Client,
    job: ChainJob,
    devnet: Devnet,
    *,
    rpc_url: str,
    block_db_url: str,
    sink_db_url: str,
    first_block: int,
    console: Console,
    seconds: float = 10.0,
    block_time_s: float = 0.25,
    reorg_depth: int = 3,
    transfers: Transfers | None = None,
) -> LiveFigures:
    """Mine for ``seconds`` with ingest following; the block cluster writes each new
    block of ``job`` from ``first_block`` on; one reorg of ``reorg_depth``."""
    started = time.monotonic()
    figures = LiveFigures(first_block=first_block)
    db = parse_blockdb_url(block_db_url)
    stop_ingest = asyncio.Event()
    follow = IngestOptions(follow=True, poll_interval_s=_POLL_S, batch_size=20)
    ingesting = asyncio.create_task(ingest(rpc_url, db, follow, stop=stop_ingest))
    store = await open_store(db)
    chain = LiveChain(devnet, transfers or Transfers(), figures)
    follower = BlockFollower(client, job, store, figures)
    try:
        miner = asyncio.create_task(chain.run(seconds, block_time_s, reorg_depth))
        with Live(_view(chain, follower, started), console=console, refresh_per_second=8) as screen:
            while not miner.done():
                if ingesting.done():
                    ingesting.result()  # an ingest error surfaces here
                await follower.poll()
                screen.update(_view(chain, follower, started))
                await asyncio.sleep(_POLL_S)
            miner.result()
            await follower.settle(chain.node_head, sink_db_url)
            screen.update(_view(chain, follower, started))
        console.print()
    finally:
        stop_ingest.set()
        with contextlib.suppress(Exception):
            await ingesting
        await follower.close()
        await store.close()
    figures.seconds = time.monotonic() - started
    return figures
