"""The demo's live stage: anvil mines, ingest follows, ``blockx_drive.follow`` writes each block.

Three loops run side by side for ``seconds``:

* ``LiveChain`` mines a block of transfers every ``block_time_s`` (with a snapshot
  before each, so the Devnet can fork there) and, part-way, once follow has
  written every block so far, abandons the top ``reorg_depth`` blocks for a new
  branch of as many;
* an ingest follows the node's head into the block database;
* ``Following`` runs ``blockx_drive.follow`` from the first live block, as a user runs
  it: one ``BlockTableCallConfig`` task per new block on the block cluster,
  pinned to the block's hash, and the reorg that ingest records reconciled (the
  blocks written on the abandoned branch run again on the new one). Its events
  feed the screen.

When mining stops the stage waits, within a bound, until follow has written every
live block under the hash the node holds, then stops follow (its ``stop`` event:
the tasks under way finish, the iteration ends) and ingest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Final, assert_never

import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from blockx_chain.devnet import Devnet, MinedBlock, Reorg
from blockx_chain.ingest import IngestOptions, IngestProgress, ingest
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.demo.chain import Transfers
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_client import Client
from blockx_drive import (
    BlockFailed,
    BlockRetrying,
    BlocksDeleted,
    BlockWritten,
    FollowEvent,
    FollowStarted,
    LagFrom,
    LedgerReconciled,
    ReorgReconciled,
    WatchInterrupted,
    follow,
)

_POLL_S: Final = 0.05
# How long, once mining stops, follow gets to write the last blocks.
_CATCH_UP_TIMEOUT_S: Final = 15.0
# How long a stopped follow gets to end its iteration before it is cancelled (the
# two bounds keep a stuck live stage within the demo's minute).
_STOP_TIMEOUT_S: Final = 10.0


class LiveFigures(msgspec.Struct, kw_only=True):
    first_block: int
    head: int = -1  # the node's head when mining stopped
    mined: dict[str, int] = msgspec.field(default_factory=dict)  # block hash -> ms mined
    reorg: Reorg | None = None
    # What follow reported: every hash it wrote, by block number (a reorged block
    # has two), its reorg events, and the blocks whose rows it deleted.
    written_hashes: dict[int, list[str]] = msgspec.field(default_factory=dict)
    reorgs: list[ReorgReconciled] = msgspec.field(default_factory=list)
    written: int = 0
    retries: int = 0
    deleted: int = 0
    # When follow wrote each block, since ingest stored it (``blocks.seen_at_ms``).
    stored_lags_ms: list[int] = msgspec.field(default_factory=list)
    failed: list[str] = msgspec.field(default_factory=list)
    caught_up: bool = False
    seconds: float = 0.0


class LiveChain:
    """The chain side: mines live blocks on the Devnet, with one reorg part-way."""

    def __init__(
        self,
        devnet: Devnet,
        transfers: Transfers,
        figures: LiveFigures,
        follow_caught_up: Callable[[dict[int, str]], bool],
    ) -> None:
        self.devnet = devnet
        self.transfers = transfers
        self.figures = figures
        self.follow_caught_up = follow_caught_up
        self.node_head = -1
        # The node's hash of each live block, the reorg's new branch included.
        self.hashes: dict[int, str] = {}

    def _mined(self, block: MinedBlock) -> None:
        self.figures.mined[block.hash] = time.time_ns() // 1_000_000
        self.hashes[block.number] = block.hash
        self.node_head = block.number

    async def run(self, seconds: float, block_time_s: float, reorg_depth: int) -> None:
        deadline = time.monotonic() + seconds
        reorg_at = time.monotonic() + seconds * 0.6
        mined = 0
        while time.monotonic() < deadline or self._reorg_waits(reorg_depth, deadline):
            tick = time.monotonic()
            due = (
                reorg_depth > 0
                and self.figures.reorg is None
                and tick >= reorg_at
                and mined > reorg_depth
            )
            if due and self.follow_caught_up(self.hashes):
                reorg = await self.transfers.reorg(self.devnet, reorg_depth)
                for block in reorg.new_blocks:
                    self._mined(block)
                self.figures.reorg = reorg
            elif not due:
                [block] = await self.transfers.mine(self.devnet, 1, reorgable=True)
                self._mined(block)
                mined += 1
            # Else follow has yet to write the blocks the reorg abandons (a busy
            # machine): a reorg of blocks it never wrote would show it nothing to
            # repair, so the chain waits for it.
            await asyncio.sleep(max(0.0, block_time_s - (time.monotonic() - tick)))

    def _reorg_waits(self, reorg_depth: int, deadline: float) -> bool:
        """The reorg is still to come, and follow may take a while longer to catch up."""
        pending = reorg_depth > 0 and self.figures.reorg is None
        return pending and time.monotonic() < deadline + _CATCH_UP_TIMEOUT_S


class Following:
    """The client side: ``blockx_drive.follow`` from ``figures.first_block``, its events
    recorded for the screen and the figures."""

    def __init__(
        self,
        client: Client,
        job: ChainJob,
        figures: LiveFigures,
        *,
        block_db_url: str,
        sink_db_url: str,
    ) -> None:
        self.client = client
        self.job = job
        self.figures = figures
        self.block_db_url = block_db_url
        self.sink_db_url = sink_db_url
        self.stop = asyncio.Event()
        self.written: dict[int, str] = {}  # the hash follow last wrote, by block
        self.recent: list[tuple[int, str, str, str]] = []  # number, hash, outcome, lag
        self.ingest: IngestProgress | None = None
        # Blocks follow said it rewrites for a reorg and has not written again yet.
        self.rewriting: set[int] = set()
        # Lines that stay on screen above the live table (the reorg and its fix).
        self.notes: list[str] = []

    async def run(self) -> None:
        events: AsyncIterator[FollowEvent] = follow(
            self.client,
            self.job.spec(db_url=self.block_db_url, sink_db_url=self.sink_db_url),
            from_block=self.figures.first_block,
            poll_interval_s=_POLL_S,
            stop=self.stop,
        )
        async for event in events:
            self._record(event)

    def _record(self, event: FollowEvent) -> None:
        f = self.figures
        match event:
            case FollowStarted():
                pass
            case BlockWritten():
                self.written[event.number] = event.hash
                f.written += 1
                f.written_hashes.setdefault(event.number, []).append(event.hash)
                if event.lag_from is LagFrom.INGEST:
                    f.stored_lags_ms.append(event.lag_ms)
                self._show(event.number, event.hash, f"written, {event.rows} rows")
                if event.number in self.rewriting:
                    self.rewriting.discard(event.number)
                    self.notes.append(
                        f"[yellow]block {event.number} rewritten[/] on the new branch "
                        f"{event.hash[:12]}…, {event.rows} rows"
                    )
            case BlockRetrying():
                f.retries += 1
                self._show(event.number, event.hash, f"retrying ({event.failure_code})")
            case BlockFailed():
                f.failed.append(f"{event.task_id}: {event.failure_code} {event.failure_message}")
                self._show(event.number, event.hash, f"failed ({event.failure_code})")
            case ReorgReconciled():
                f.reorgs.append(event)
                self.rewriting.update(event.rewritten)
                self.notes.append(
                    f"[bold yellow]reorg[/] of depth {event.depth} above block "
                    f"{event.fork_block_number}: follow rewrites {len(event.rewritten)} blocks "
                    f"written on the abandoned branch "
                    f"({', '.join(map(str, event.rewritten)) or 'none'}), deletes "
                    f"{len(event.deleted)}"
                )
            case BlocksDeleted():
                f.deleted += len(event.numbers)
                for number in event.numbers:
                    self.written.pop(number, None)
            case LedgerReconciled():
                self.rewriting.update(event.rewritten)
                f.deleted += len(event.deleted)
                for number in event.deleted:
                    self.written.pop(number, None)
            case WatchInterrupted():
                pass
            case _:
                assert_never(event)

    def _show(self, number: int, block_hash: str, outcome: str) -> None:
        mined = self.figures.mined.get(block_hash)
        lag = "" if mined is None else f"{time.time_ns() // 1_000_000 - mined} ms"
        self.recent = [*self.recent[-7:], (number, block_hash, outcome, lag)]

    def caught_up(self, hashes: dict[int, str]) -> bool:
        """Follow has written every block of ``hashes`` under that hash."""
        return all(self.written.get(n) == h for n, h in hashes.items())


def _view(chain: LiveChain, following: Following, started: float) -> Group:
    table = Table(title="live blocks (blockx_drive.follow on the block cluster)", expand=False)
    for column in ("block", "hash", "follow", "mined → written"):
        table.add_column(column, justify="right" if column == "block" else "left")
    for number, block_hash, outcome, lag in following.recent:
        reorged = chain.figures.reorg is not None and number in chain.figures.reorg.old_hashes
        table.add_row(
            str(number), block_hash[:12] + "…", outcome, lag, style="yellow" if reorged else ""
        )
    f = following.figures
    progress = following.ingest
    ingested = "-" if progress is None or progress.head is None else str(progress.head)
    status = Text(
        f"  {time.monotonic() - started:4.1f} s  node head {chain.node_head}  "
        f"ingested {ingested}  written {f.written}  retries {f.retries}  "
        f"reorgs seen by ingest {0 if progress is None else progress.reorgs}"
    )
    return Group(table, status)


def _print_notes(following: Following, screen: Live) -> None:
    for note in following.notes:
        screen.console.print(f"  {note}")
    following.notes.clear()


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
    seconds: float = 5.0,
    block_time_s: float = 0.25,
    reorg_depth: int = 3,
    transfers: Transfers | None = None,
) -> LiveFigures:
    """Mine for ``seconds`` with ingest following and ``blockx_drive.follow`` writing each
    new block of ``job`` from ``first_block`` on; one reorg of ``reorg_depth``."""
    started = time.monotonic()
    figures = LiveFigures(first_block=first_block)
    following = Following(client, job, figures, block_db_url=block_db_url, sink_db_url=sink_db_url)
    chain = LiveChain(devnet, transfers or Transfers(), figures, following.caught_up)

    def on_ingest(progress: IngestProgress) -> None:
        following.ingest = progress

    stop_ingest = asyncio.Event()
    options = IngestOptions(follow=True, poll_interval_s=_POLL_S, batch_size=20)
    ingesting = asyncio.create_task(
        ingest(
            rpc_url,
            parse_blockdb_url(block_db_url),
            options,
            stop=stop_ingest,
            on_progress=on_ingest,
        )
    )
    follower = asyncio.create_task(following.run())
    miner = asyncio.create_task(chain.run(seconds, block_time_s, reorg_depth))
    try:
        with Live(
            _view(chain, following, started), console=console, refresh_per_second=8
        ) as screen:
            catch_up_by: float | None = None
            while not (ingesting.done() or follower.done()):
                _print_notes(following, screen)
                screen.update(_view(chain, following, started))
                if miner.done():
                    miner.result()
                    if catch_up_by is None:
                        catch_up_by = time.monotonic() + _CATCH_UP_TIMEOUT_S
                    if following.caught_up(chain.hashes) or time.monotonic() > catch_up_by:
                        break
                await asyncio.sleep(_POLL_S)
            for side in (ingesting, follower):
                if side.done():
                    side.result()  # an ingest or follow error surfaces here
            figures.caught_up = following.caught_up(chain.hashes)
            if not figures.caught_up:
                figures.failed.append(
                    f"follow had not written every live block up to {chain.node_head} "
                    f"under the node's hash (waited up to {_CATCH_UP_TIMEOUT_S:g} s after "
                    "mining stopped)"
                )
            figures.head = chain.node_head
            following.stop.set()
            try:
                await asyncio.wait_for(follower, _STOP_TIMEOUT_S)
            except TimeoutError:
                figures.failed.append(f"follow did not stop within {_STOP_TIMEOUT_S:g} s")
            _print_notes(following, screen)
            screen.update(_view(chain, following, started))
        console.print()
    finally:
        for task in (miner, follower):
            task.cancel()
        stop_ingest.set()
        with contextlib.suppress(Exception):
            await ingesting
        await asyncio.gather(miner, follower, return_exceptions=True)
    figures.seconds = time.monotonic() - started
    return figures
