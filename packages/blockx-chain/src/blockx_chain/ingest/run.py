"""One ingest run: fill the block database from a node, reorg-aware.

The run:

1. asks the node its chain id, genesis block, head and finalized block, and checks
   the answers (a node that does not answer, or answers wrongly, is reported before
   the database is opened or created);
2. opens the database, takes the run's ingest lock (one ingest per database), and
   checks the chain (a database of another chain is refused). The chain row of a
   new database is written with the first batch, in its transaction;
3. checks the stored head against the node (a reorg at the same height shows
   only there);
4. fetches batches of blocks, ``in_flight`` of them at a time, and writes them in
   order, one database transaction per batch. Each batch is compared with the
   stored blocks around it (``plan.check_batch``): it extends the chain, or the
   stored branch is no longer the node's, and the run walks back to the fork
   point, deletes every row above it, records the reorg (one transaction) and
   goes on from the fork;
5. with ``follow``, waits for new heads until ``stop`` is set, then returns after
   the transaction under way: a head pushed by the node's newHeads subscription
   wakes it at once, the poll interval otherwise (``blockx_chain.ingest.heads``).

With ``traces`` (or into a database that holds traces) the run chooses the node's
trace method once, before the first batch (``blockx_chain.ingest.traces``), and
each batch asks for its blocks' call frames alongside the blocks and receipts.

A selective run (``IngestOptions.logs``) fetches, per range, the logs that match
its filter and the headers of the blocks they fall in, of the blocks within
``max_reorg_depth`` of the node's head and of the range's last block
(``blockx_chain.ingest.log_fetch``), with the same lock, checks, reorg walk and
epochs; a range is written whole (what the database held in it goes first). The
database records its filter with its first range (``log_filter``); a full run into
it, a selective run into a database of whole blocks, or one with another filter,
is refused before anything is written.

The decisions are the pure functions of ``blockx_chain.ingest.plan`` and
``blockx_chain.ingest.log_ranges``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from blockx_chain.ingest import plan
from blockx_chain.ingest.errors import IngestError, NodeUnusable
from blockx_chain.ingest.fetch import (
    RETRY_ATTEMPTS,
    BatchFetcher,
    NodeShortened,
    backoff_s,
    failed,
    node_identity,
)
from blockx_chain.ingest.heads import Heads
from blockx_chain.ingest.lock import LOCK_SUFFIX, ingest_lock
from blockx_chain.ingest.log_fetch import LogFetcher, LogQuery
from blockx_chain.ingest.log_ranges import DEFAULT_MAX_WIDTH, DEFAULT_WIDTH, LogRanges
from blockx_chain.ingest.traces import TraceMethod, choose_method
from blockx_chain.rpc import DEFAULT_MAX_RESPONSE_BYTES, EthRpc, JsonRpcClient, RpcError
from blockx_chain.schema import (
    BLOCKS,
    CONTRACTS,
    ERC20_TRANSFERS,
    LOGS,
    NFT_TRANSFERS,
    TRACES,
    TRANSACTIONS,
    BlockRows,
    ChainState,
    LogFilterRecord,
    RowError,
)
from blockx_chain.store import BlockStore, BlockWriter, open_store
from blockx_chain.store.base import check_chain
from blockx_chain.url import BlockDbUrl, InvalidWsUrl, SqliteUrl, resolve_ws_url

DEFAULT_IN_FLIGHT = 4


class IngestOptions(msgspec.Struct, frozen=True, kw_only=True):
    from_block: int | None = None  # None: the stored head + 1, or 0 when empty
    to_block: int | None = None  # None: the node's head ("latest")
    follow: bool = False
    confirmations: int = plan.DEFAULT_CONFIRMATIONS
    batch_size: int = plan.DEFAULT_BATCH_SIZE
    max_reorg_depth: int = plan.DEFAULT_MAX_REORG_DEPTH
    allow_deep_reorg: bool = False
    in_flight: int = DEFAULT_IN_FLIGHT
    poll_interval_s: float = plan.DEFAULT_POLL_INTERVAL_S
    # Following: the node's WebSocket for newHeads (CHAIN_WS_URL); None derives it
    # from the HTTP URL (http→ws, https→wss), ``none`` polls only.
    ws_url: str | None = None
    # Ingest every block's call frames too (``traces``, and ``contracts`` made inside
    # transactions). A database once ingested with traces always gets them.
    traces: bool = False
    # A selective run: only the logs of this filter (and their blocks' headers).
    logs: LogQuery | None = None
    log_range: int = DEFAULT_WIDTH  # blocks of the first eth_getLogs
    max_log_range: int = DEFAULT_MAX_WIDTH
    # The largest answer read (RPC_MAX_RESPONSE_BYTES); a larger log answer is split.
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    def check(self) -> None:
        for name, value, least in (
            ("batch size", self.batch_size, 1),
            ("confirmations", self.confirmations, 0),
            ("max reorg depth", self.max_reorg_depth, 1),
            ("batches in flight", self.in_flight, 1),
            ("largest answer (RPC_MAX_RESPONSE_BYTES)", self.max_response_bytes, 1024),
        ):
            if value < least:
                raise IngestError(f"the {name} must be {least} or more, got {value}")
        if self.batch_size > plan.MAX_BATCH_SIZE:
            raise IngestError(
                f"the batch size must be {plan.MAX_BATCH_SIZE} or less, got {self.batch_size}"
            )
        if self.to_block is not None and self.to_block < 0:
            raise IngestError(f"--to must be 0 or more, got {self.to_block}")
        if not 1 <= self.log_range <= self.max_log_range:
            raise IngestError(
                f"--log-range must be 1 to --max-log-range ({self.max_log_range}), "
                f"got {self.log_range}"
            )
        if self.logs is not None and self.traces:
            raise IngestError(
                "--traces needs whole blocks, and --logs ingests only the logs asked for: "
                "use one or the other"
            )


class IngestSummary(msgspec.Struct, kw_only=True):
    """This run's work: ``from_block`` the lowest block it wrote or meant to (a reorg
    takes it down to the fork point + 1), ``to_block`` the highest it aimed for."""

    from_block: int
    to_block: int
    blocks: int = 0
    transactions: int = 0
    logs: int = 0
    erc20_transfers: int = 0
    nft_transfers: int = 0
    traces: int = 0
    contracts: int = 0
    # The node's method for call frames; None: this run ingested none.
    trace_method: str | None = None
    reorgs: int = 0
    seconds: float = 0.0
    # A selective run: its filter, the blocks it scanned for logs, and its log queries.
    log_filter: LogFilterRecord | None = None
    scanned: int = 0
    log_requests: int = 0
    log_splits: int = 0
    narrowest_log_range: int = 0
    widest_log_range: int = 0
    rate_limited_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "from": self.from_block,
            "to": self.to_block,
            "blocks": self.blocks,
            "transactions": self.transactions,
            "logs": self.logs,
            "erc20_transfers": self.erc20_transfers,
            "nft_transfers": self.nft_transfers,
            "traces": self.traces,
            "contracts": self.contracts,
            "trace_method": self.trace_method,
            "reorgs": self.reorgs,
            "seconds": round(self.seconds, 3),
        }
        if self.log_filter is not None:
            data["log_filter"] = self.log_filter.as_json()
            data["scanned"] = self.scanned
            data["log_requests"] = self.log_requests
            data["log_splits"] = self.log_splits
            data["log_ranges"] = [self.narrowest_log_range, self.widest_log_range]
            data["rate_limited_s"] = round(self.rate_limited_s, 3)
        return data


class IngestProgress(msgspec.Struct, frozen=True, kw_only=True):
    head: int | None  # the stored head
    node_head: int
    finalized: int | None
    blocks: int
    reorgs: int
    seconds: float

    @property
    def lag(self) -> int:
        return self.node_head - (-1 if self.head is None else self.head)

    @property
    def blocks_per_s(self) -> float:
        return self.blocks / self.seconds if self.seconds > 0 else 0.0


ProgressCallback = Callable[[IngestProgress], None]
# Fetches under way, oldest first: written in this order.
_Pending = deque[tuple[range, "asyncio.Task[list[BlockRows]]"]]


async def ingest(
    rpc_url: str,
    db_url: BlockDbUrl,
    options: IngestOptions | None = None,
    *,
    stop: asyncio.Event | None = None,
    on_progress: ProgressCallback | None = None,
) -> IngestSummary:
    """Run one ingest; IngestError (or a StoreError) says why it stopped."""
    options = options or IngestOptions()
    options.check()
    try:
        ws_url = resolve_ws_url(options.ws_url, rpc_url) if options.follow else None
    except InvalidWsUrl as exc:
        raise IngestError(f"the node's WebSocket (CHAIN_WS_URL) {exc}") from None
    async with JsonRpcClient(
        rpc_url, max_batch=2 * options.batch_size, max_response_bytes=options.max_response_bytes
    ) as client:
        eth = EthRpc(client)
        fetcher = BatchFetcher(eth)
        log_fetcher = (
            None
            if options.logs is None
            else LogFetcher(
                eth,
                options.logs,
                LogRanges(width=options.log_range, max_width=options.max_log_range),
            )
        )
        # The node's first answers are checked before the database is opened: a node
        # that cannot be used leaves no file behind.
        node = _Node(*await node_identity(eth), *await fetcher.head())
        # A SQLite database this run makes.
        new_file = (
            db_url.path if isinstance(db_url, SqliteUrl) and not db_url.path.exists() else None
        )
        store = await open_store(db_url)
        try:
            derived = options.ws_url is None
            async with ingest_lock(db_url), Heads(ws_url, derived=derived) as heads:
                run = _Run(store, fetcher, node, options, stop or asyncio.Event(), on_progress)
                run.log_fetcher = log_fetcher
                run.heads = heads
                try:
                    return await run.run()
                except BaseException:
                    # A database this run made and never wrote a batch into (the chain
                    # row comes with the first) goes again, under the run's lock: a
                    # refused run leaves no file behind.
                    if new_file is not None and await _empty(store):
                        _remove_sqlite(new_file)
                    raise
        finally:
            await store.close()


async def _empty(store: BlockStore) -> bool:
    with contextlib.suppress(Exception):
        return await store.chain() is None
    return False


def _remove_sqlite(path: Path) -> None:
    """The database file and SQLite's files beside it (its open connections keep
    what they have until they close)."""
    for suffix in ("", "-wal", "-shm", LOCK_SUFFIX):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


class _Node(msgspec.Struct, frozen=True):
    """What the node said before the database was opened."""

    chain_id: int
    genesis: str
    head: int
    finalized: int | None


class _Run:
    def __init__(
        self,
        store: BlockStore,
        fetcher: BatchFetcher,
        node: _Node,
        options: IngestOptions,
        stop: asyncio.Event,
        on_progress: ProgressCallback | None,
    ) -> None:
        self.store = store
        self.fetcher = fetcher
        self.node = node
        self.options = options
        self.stop = stop
        self.on_progress = on_progress
        self.started = time.monotonic()
        self.head: int | None = None
        self.head_hash: str | None = None
        self.finalized: int | None = None
        self.epoch = 0
        self.node_head = node.head
        self.node_finalized = node.finalized
        # Record, with the first batch written, that the database holds traces.
        self.mark_traces = False
        self.log_fetcher: LogFetcher | None = None
        # A selective run: the database's filter (None until its first range).
        self.log_filter: LogFilterRecord | None = None
        # Following: when to look at the node's head again.
        self.heads = Heads(None)

    async def run(self) -> IngestSummary:
        opts = self.options
        state = await self.store.chain()
        if state is not None:
            check_chain(state, self.node.chain_id, self.node.genesis)
            self.head, self.head_hash = state.head_number, state.head_hash
            self.finalized, self.epoch = state.finalized_number, state.epoch
            self.log_filter = await self.store.log_filter()
            plan.check_filter(self.log_filter, None if opts.logs is None else opts.logs.record(0))
        start = plan.start_block(self.head, opts.from_block)
        if self.log_filter is not None and start < self.log_filter.from_block:
            raise IngestError(
                f"--from {start} is below block {self.log_filter.from_block}, where the "
                "database's logs start: a run stopped short would leave the blocks between "
                "unscanned; ingest the earlier blocks into another database"
            )
        target = self._target()
        trace_method = await self._trace_method(state)
        if opts.from_block is not None and opts.from_block > self.node_head and not opts.follow:
            raise IngestError(
                f"--from {opts.from_block} is above the node's head {self.node_head}: "
                "pass --follow to wait for it"
            )
        if opts.to_block is not None and not opts.follow:
            if opts.to_block > self.node_head:
                raise IngestError(
                    f"--to {opts.to_block} is above the node's head {self.node_head}: "
                    "pass --follow to wait for it"
                )
            if opts.to_block < start:
                raise IngestError(f"--to {opts.to_block} is below --from {start}")
        self.summary = IngestSummary(
            from_block=start,
            to_block=max(target, start - 1),
            trace_method=None if trace_method is None else trace_method.value,
        )
        if opts.logs is not None:
            self.summary.log_filter = self.log_filter or opts.logs.record(start)
        next_number = start
        if self.head is not None and start > self.head:
            next_number = await self._check_tip(next_number)
            self.summary.from_block = min(start, next_number)
        pending: _Pending = deque()
        shortened = 0  # batches in a row the node lacked a block of
        try:
            while not self.stop.is_set():
                next_number = self._fill(pending, next_number, target)
                if not pending:
                    if not opts.follow or self._reached_to(next_number):
                        break
                    await self.heads.wait(self.stop, opts.poll_interval_s)
                    await self._poll_head()
                    self.heads.polled(self.node_head)
                    target = self._target()
                    next_number = await self._check_tip(next_number)
                    self.summary.from_block = min(self.summary.from_block, next_number)
                    self._report(target)
                    continue
                numbers, task = pending.popleft()
                try:
                    batch = await task
                except NodeShortened as exc:
                    await _cancel(pending)
                    shortened += 1
                    if shortened > RETRY_ATTEMPTS:
                        raise NodeUnusable(
                            f"{exc}, though its head is {self.node_head} (asked {shortened} times)"
                        ) from None
                    await self._wait(backoff_s(shortened))
                    next_number = numbers.start
                    target = await self._head_again(target)
                    continue
                shortened = 0
                # Keep in_flight batches coming while this one is written.
                next_number = self._fill(pending, next_number, target)
                restart = await self._write(batch, numbers)
                if restart is not None:
                    await _cancel(pending)
                    next_number = restart
                    self.summary.from_block = min(self.summary.from_block, restart)
                    target = await self._head_again(target)
                self._report(target)
        finally:
            await _cancel(pending)
            self._log_figures()
        self.summary.seconds = time.monotonic() - self.started
        return self.summary

    async def _trace_method(self, state: ChainState | None) -> TraceMethod | None:
        """Whether this run traces (``--traces``, or a database that holds traces), and
        the node's method for it. A database of blocks without traces takes none:
        its blocks so far would have none."""
        held = await self.store.holds_traces()
        if not (self.options.traces or held):
            return None
        if not held and state is not None and state.head_number is not None:
            raise IngestError(
                f"the block database holds blocks 0..{state.head_number} without traces: "
                "ingest with --traces into a new database"
            )
        self.mark_traces = not held
        try:
            method = await choose_method(self.fetcher.eth, self.node_head)
        except RpcError as exc:
            raise failed(exc, "traces: ") from None
        self.fetcher.traces = method
        return method

    def _log_figures(self) -> None:
        if self.log_fetcher is None:
            return
        ranges = self.log_fetcher.ranges
        self.summary.log_requests = ranges.requests
        self.summary.log_splits = ranges.splits
        self.summary.narrowest_log_range = ranges.narrowest if ranges.requests else 0
        self.summary.widest_log_range = ranges.widest
        self.summary.rate_limited_s = self.log_fetcher.rate_limited_s

    def _fill(self, pending: _Pending, next_number: int, target: int) -> int:
        """Start fetches until ``in_flight`` are under way; the next block to fetch."""
        while len(pending) < self.options.in_flight:
            if self.log_fetcher is None:
                numbers = plan.next_batch(next_number, target, self.options.batch_size)
                if numbers is None:
                    break
                task = asyncio.create_task(self.fetcher.blocks(numbers))
            else:
                numbers = plan.next_batch(next_number, target, self.log_fetcher.ranges.width)
                if numbers is None:
                    break
                # Headers of every block a reorg may still reach, so one is seen.
                near_head = self.node_head - self.options.max_reorg_depth + 1
                task = asyncio.create_task(self.log_fetcher.blocks(numbers, near_head))
            pending.append((numbers, task))
            next_number = numbers.stop
        return next_number

    def _target(self) -> int:
        to = self.options.to_block
        return self.node_head if to is None else min(to, self.node_head)

    def _reached_to(self, next_number: int) -> bool:
        to = self.options.to_block
        return to is not None and next_number > to

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _poll_head(self) -> None:
        self.node_head, self.node_finalized = await self.fetcher.head()

    async def _head_again(self, target: int) -> int:
        """After a reorg or a miss, the node's head may be lower than it was: read it
        and return the block to aim for (never above ``target`` unless following)."""
        await self._poll_head()
        return self._target() if self.options.follow else min(target, self.node_head)

    def _report(self, target: int) -> None:
        self.summary.to_block = max(self.summary.to_block, target)
        if self.on_progress is not None:
            self.on_progress(
                IngestProgress(
                    head=self.head,
                    node_head=self.node_head,
                    finalized=self.finalized,
                    blocks=self.summary.blocks
                    if self.log_fetcher is None
                    else self.summary.scanned,
                    reorgs=self.summary.reorgs,
                    seconds=time.monotonic() - self.started,
                )
            )

    async def _check_tip(self, next_number: int) -> int:
        """A reorg that kept the height shows only at the stored head: compare it
        with the node's block there. The block to go on from."""
        if self.head is None or self.head_hash is None or self.node_head < self.head:
            # A node behind the database (lagging, or on a shorter branch) is waited
            # for: its next block above the stored head settles which it is.
            return next_number
        node = await self.fetcher.hashes([self.head])
        if node.get(self.head) == self.head_hash:
            return next_number
        fork = await self._reorg(self.head)
        return min(next_number, fork + 1)

    async def _stored(self, first: int, last: int) -> dict[int, plan.StoredBlock]:
        rows = await self.store.blocks(max(first, 0), last)
        return {
            r["block_number"]: plan.StoredBlock(r["block_hash"], r["parent_hash"]) for r in rows
        }

    async def _write(self, batch: list[BlockRows], span: range) -> int | None:
        """Write one fetched batch (of blocks ``span``) in one transaction. None when
        it was written; the block to go on from when a reorg below the batch had to be
        applied first."""
        numbers = [b.block.block_number for b in batch]
        hashes = [b.block.block_hash for b in batch]
        parents = [b.block.parent_hash for b in batch]
        first, last = span.start, span.stop - 1
        async with self.store.writer() as w:
            if self.head is None:
                # Nothing written yet: the chain row goes with the first batch.
                await w.init_chain(self.node.chain_id, self.node.genesis)
            if self.mark_traces:
                await w.mark_traces()
                self.mark_traces = False
            stored = await self._stored(first - 1, last + 1)
            if self.log_fetcher is not None:
                if plan.check_headers(numbers, hashes, parents, stored) == plan.Extends():
                    await self._insert_range(w, batch, span)
                    return None
                check: plan.BatchCheck = plan.Diverges(fork=None)
            else:
                check = plan.check_batch(numbers, hashes, parents, stored)
            match check:
                case plan.Diverges(fork=None):
                    pass  # walk back below the batch, outside this transaction
                case plan.Diverges(fork=int(fork)):
                    # The batch itself sits on the fork: drop the old branch and
                    # write the batch in the same transaction.
                    await self._apply_reorg(w, fork, {fork: stored[fork].hash}, hashes[-1])
                    await self._insert(w, batch)
                    return None
                case plan.Extends():
                    await self._insert(w, batch)
                    return None
        fork = await self._reorg(first - 1)
        return fork + 1

    async def _insert_range(self, w: BlockWriter, batch: list[BlockRows], span: range) -> None:
        """A selective run's range: its filter recorded with the database's first
        range (and the lowest block scanned kept), then the range written whole."""
        assert self.options.logs is not None
        if self.log_filter is None or span.start < self.log_filter.from_block:
            self.log_filter = self.options.logs.record(span.start)
            await w.set_log_filter(self.log_filter)
            self.summary.log_filter = self.log_filter
        await w.delete_between(span.start, span.stop - 1)
        await self._insert(w, batch)
        self.summary.scanned += len(span)

    async def _insert(self, w: BlockWriter, batch: list[BlockRows]) -> None:
        try:
            written = await w.insert_blocks(batch, seen_at_ms=int(time.time() * 1000))
        except RowError as exc:
            raise IngestError(f"a block breaks the block database's schema: {exc}") from None
        self.summary.blocks += written[BLOCKS.name]
        self.summary.transactions += written[TRANSACTIONS.name]
        self.summary.logs += written[LOGS.name]
        self.summary.erc20_transfers += written[ERC20_TRANSFERS.name]
        self.summary.nft_transfers += written[NFT_TRANSFERS.name]
        self.summary.traces += written[TRACES.name]
        self.summary.contracts += written[CONTRACTS.name]
        last = batch[-1].block
        if self.head is None or last.block_number >= self.head:
            self.head, self.head_hash = last.block_number, last.block_hash
        await self._set_chain(w)

    async def _set_chain(self, w: BlockWriter) -> None:
        self.finalized = plan.finalized_number(
            self.head, self.options.confirmations, self.node_finalized, self.finalized
        )
        await w.set_chain(
            head_number=self.head,
            head_hash=self.head_hash,
            finalized_number=self.finalized,
            epoch=self.epoch,
        )

    async def _reorg(self, top: int) -> int:
        """Walk back from ``top`` to the last block the stored chain shares with the
        node's, and delete everything above it (one transaction). The fork point."""
        assert self.head is not None
        window = plan.walk_window(top, self.head, self.options.max_reorg_depth)
        node = await self.fetcher.hashes([n for n in window if n <= self.node_head])
        stored = {n: b.hash for n, b in (await self._stored(window.start, window.stop - 1)).items()}
        fork = plan.fork_point(stored, node, top)
        async with self.store.writer() as w:
            new_head = node.get(top) or node.get(max(node, default=-1), "")
            await self._apply_reorg(w, fork, stored, new_head)
        assert fork is not None  # _apply_reorg refused otherwise
        return fork

    async def _apply_reorg(
        self, w: BlockWriter, fork: int | None, stored: dict[int, str], new_head_hash: str
    ) -> None:
        assert self.head is not None
        assert self.head_hash is not None
        decision = plan.plan_reorg(
            fork,
            self.head,
            self.finalized,
            self.options.max_reorg_depth,
            self.options.allow_deep_reorg,
        )
        fork_number = decision.fork_block_number
        await w.delete_above(fork_number)
        await w.record_reorg(
            detected_at_ms=int(time.time() * 1000),
            fork_block_number=fork_number,
            depth=decision.depth,
            old_head_hash=self.head_hash,
            new_head_hash=new_head_hash,
        )
        self.summary.reorgs += 1
        self.head, self.head_hash = fork_number, stored[fork_number]
        if decision.new_epoch:
            # Blocks once final changed: every read cached under the old epoch drops.
            self.epoch += 1
            self.finalized = None
        await self._set_chain(w)


async def _cancel(pending: _Pending) -> None:
    """Stop fetches no longer wanted (their blocks may be of an abandoned branch)."""
    tasks = [task for _, task in pending]
    pending.clear()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
