"""``follow``: keep a sink table computed for every new block, reorgs included.

Follow looks at the block database (kept fresh by ``blockx chain ingest --follow``)
when ingest's commit wakes it (``blockx_drive._follow.push``) and at every poll
interval:

* every new block gets one BlockTableCallConfig task on the block cluster, pinned
  to the block's hash (``{"number", "hash"}``), submitted in block order with at
  most ``tasks_in_flight`` under way; a retryable failure runs again under a new
  task_id of its lineage (``blockx_drive.attempts``), up to ``max_attempts``
  attempts; a block that failed for good is reported, and follow goes on or
  stops as ``on_failure`` says;
* on every start, and after every gap in its watching (a database it could not
  read for a while, a pause: ``blockx_drive._follow.watch``), the ledger is
  compared with the canonical chain over the window a reorg can reach
  (``blockx_drive.ledger.reach``: every ledger block above the finalized height,
  and at least ``reorg_window`` blocks below the head): blocks written under
  another hash run again, blocks the chain no longer holds have their rows and
  ledger entries deleted;
* every row of ``reorgs`` above its cursor (the last id seen) is reconciled the
  same way from the fork up;
* every finished task is checked against the chain as it is then: a block
  writer checks canonicity before it commits, but where the sink and the block
  database are different databases that check cannot be atomic with the commit,
  so a block written, or failed, on a branch abandoned meanwhile is run again (or
  deleted).

It starts at ``from_block`` or, without it, at the oldest gap among the last
``RESUME_WINDOW`` blocks of the ledger (after the highest written block when
there is none), or at the head on an empty ledger. Blocks already in the ledger
with their canonical hash are skipped. A database that cannot be reached at
start ends follow; one that cannot be read later is waited for. It runs until
``stop`` is set (then the tasks under way finish and are reported; one a client
cancelled meanwhile, as ``blockx follow`` does on Ctrl-C, is left for the next
run) or the iteration is closed (then the tasks under way are cancelled on their
Workers, best effort, and their waits too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from blockx_chain.sink import SinkStore, SinkUnavailable, open_sink
from blockx_chain.store import BlockStore, StoreUnavailable, open_store
from blockx_chain.url import BlockDbUrl
from blockx_client.attempts import (
    Attempt,
    AttemptBook,
    AttemptPump,
    Retrying,
    Succeeded,
    Verdict,
    verdict,
)
from blockx_client.models import TaskResult
from blockx_drive._follow.events import (
    BlockFailed,
    BlockRetrying,
    BlocksDeleted,
    BlockWritten,
    FollowEvent,
    FollowStarted,
    LedgerReconciled,
    ReorgReconciled,
    WatchInterrupted,
)
from blockx_drive._follow.push import Pushes
from blockx_drive._follow.record import FollowProgress
from blockx_drive._follow.spec import FollowSpec
from blockx_drive._follow.watch import GapReason, Watch
from blockx_drive.attempts import (
    ClusterUnreachable,
    cancelled_by_client,
    check_bounded,
    out_of_reach,
    run_attempt,
    unanswered,
)
from blockx_drive.defaults import (
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REORG_WINDOW,
    REORG_WINDOW_LIMIT,
    RESUME_WINDOW,
    OnFailure,
)
from blockx_drive.job_progress import new_record
from blockx_drive.jobs import JobKind, JobRecorder, LagFrom, new_job_id, now_ms
from blockx_drive.ledger import (
    Reconciliation,
    canonical_blocks,
    catch_up_lake,
    delete_written,
    planning_chain,
    reach,
    reconcile,
    written_hashes,
)
from blockx_drive.spec import JobSpec, check, check_block_number, command_of
from blockx_drive.submission import check_function, check_sink

if TYPE_CHECKING:
    from blockx_client import Client

# How long a stopped follow waits for the tasks under way before it cancels them.
STOP_GRACE_S: Final = 15.0
# Blocks read from the block database at a time while catching up.
SCAN_AHEAD: Final = 64
_REORG_PAGE: Final = 1000
_LEDGER_PAGE: Final = 10_000


class _Job:
    """One block on one hash, and the attempt it is at."""

    __slots__ = ("attempt", "hash", "number", "seen_ms", "stored_ms")

    def __init__(
        self, number: int, block_hash: str, stored_ms: int | None, seen_ms: int, attempt: Attempt
    ) -> None:
        self.number = number
        self.hash = block_hash
        # When ingest stored the block (None: not recorded), and when follow saw it.
        self.stored_ms = stored_ms
        self.seen_ms = seen_ms
        self.attempt = attempt


class Follower:
    """The state of one follow run; ``open`` then ``events`` drive it."""

    def __init__(
        self,
        client: Client,
        store: BlockStore,
        sink: SinkStore,
        spec: FollowSpec,
        sink_url: BlockDbUrl | None = None,
        changed: asyncio.Event | None = None,
    ) -> None:
        self._pushes = Pushes(changed)
        self._store = store
        self._sink = sink
        # The sink's database, where a lake table's rows are deleted through the lake.
        self._sink_url = sink_url
        self._spec = spec
        # The lowest block this run may rewind to, and the next block to look at.
        self._start = 0
        self._next = 0
        self._cursor = 0
        # The ledger as this run knows it, for blocks from ``_start``.
        self._written: dict[int, str] = {}
        # The attempts under way, a block's lineage under its number.
        self._pump = AttemptPump[_Job](
            AttemptBook(max_attempts=spec.max_attempts),
            run=functools.partial(run_attempt, client),
            cancel=client.cancel_in_flight,
            in_flight=spec.tasks_in_flight,
        )
        # Resubmissions waiting for a free place, by block number.
        self._queued: dict[int, _Job] = {}
        # Finished attempts not judged yet (a database could not be read).
        self._finished: deque[tuple[_Job, TaskResult]] = deque()
        # A block failed for good and ``on_failure`` is STOP.
        self._halted = False
        # A block's attempts never reached the cluster: follow ends with this.
        self._unreachable: ClusterUnreachable | None = None
        # What happened, not reported yet.
        self._outbox: deque[FollowEvent] = deque()
        self._watch = Watch(now_ms(), poll_interval_ms=int(spec.poll_interval_s * 1000))

    # ---- start ---------------------------------------------------------------------

    async def open(self, from_block: int | None) -> tuple[FollowStarted, LedgerReconciled]:
        """Reconcile the ledger with the chain as it is now, whatever happened while
        follow was stopped, then decide where to start."""
        table = self._spec.sink_table
        head = await self._store.head()
        self._cursor = await self._last_reorg_id()
        reconciled = await self._reconcile_ledger(GapReason.START)
        if from_block is not None:
            start = from_block
        else:
            span = await self._sink.written_span(table, self._spec.chain_id)
            if span is not None:
                low, high = span
                first = max(low, high - RESUME_WINDOW + 1)
                start = self._oldest_gap(
                    await written_hashes(self._sink, table, self._spec.chain_id, first), first, high
                )
            else:
                start = 0 if head is None else head["number"]
        # Blocks of the reconciled window stay this run's to rewrite, below ``start`` too.
        floor = start if reconciled.from_block is None else min(start, reconciled.from_block)
        self._start, self._next = floor, start
        written = await written_hashes(self._sink, table, self._spec.chain_id, floor)
        self._written = {n: h for n, h in written.items() if n not in self._queued}
        self._watch.looked(now_ms())
        started = FollowStarted(
            job_id=self._spec.job_id,
            from_block=start,
            head=None if head is None else head["number"],
            reorg_cursor=self._cursor,
        )
        return started, reconciled

    @staticmethod
    def _oldest_gap(written: Mapping[int, str], low: int, high: int) -> int:
        for number in range(low, high + 1):
            if number not in written:
                return number
        return high + 1

    async def _last_reorg_id(self) -> int:
        cursor = 0
        while True:
            rows = await self._store.reorgs(cursor, _REORG_PAGE)
            if not rows:
                return cursor
            cursor = rows[-1]["id"]

    # ---- the loop ------------------------------------------------------------------

    async def events(self, stop: asyncio.Event) -> AsyncGenerator[FollowEvent, None]:
        stopper = asyncio.ensure_future(stop.wait())
        give_up_at: float | None = None
        try:
            while True:
                wait_s = self._spec.poll_interval_s
                self._pushes.looking()
                try:
                    await self._judge()
                    if not (stop.is_set() or self._halted):
                        await self._look()
                except (StoreUnavailable, SinkUnavailable) as exc:
                    wait_s = self._watch.lost(random.random())
                    self._outbox.append(WatchInterrupted(message=str(exc), retry_in_s=wait_s))
                while self._outbox:
                    yield self._outbox.popleft()
                if self._unreachable is not None:
                    raise self._unreachable
                if stop.is_set() or self._halted:  # (stop may have been set meanwhile)
                    if give_up_at is None:
                        give_up_at = time.monotonic() + STOP_GRACE_S
                    if not len(self._pump) or time.monotonic() > give_up_at:
                        return  # what still runs is cancelled below; a restart resumes it
                also: set[asyncio.Future[Any]] = set() if stop.is_set() else {stopper}
                also |= self._pushes.waiters()
                for finished in await self._pump.wait(timeout_s=wait_s, also=also):
                    # InvalidRequestError (the task itself refused) ends follow there.
                    if stop.is_set() and cancelled_by_client(finished.result):
                        # Stopped by Ctrl-C: the block is left for the next run.
                        self._pump.book.close(finished.item.number)
                        continue
                    self._finished.append((finished.item, finished.result))
        finally:
            stopper.cancel()
            self._pushes.close()
            await self._pump.aclose()

    async def _judge(self) -> None:
        """Judge the finished attempts, in order; one whose judging cannot read a
        database stays first in line."""
        while self._finished and self._unreachable is None:
            job, result = self._finished[0]
            event = await self._completed(job, result)
            self._finished.popleft()
            if event is not None:
                self._outbox.append(event)
            if isinstance(event, BlockFailed) and unanswered(result):
                self._unreachable = out_of_reach(f"block {job.number}", job.attempt.number, result)

    async def _look(self) -> None:
        """One look at the chain: the ledger reconciled after a gap, new reorgs,
        new blocks submitted. Raises the stores' unavailable errors."""
        gap = self._watch.due(now_ms())
        if gap is not None:
            self._outbox.append(await self._reconcile_ledger(gap))
        for row in await self._store.reorgs(self._cursor, _REORG_PAGE):
            self._outbox.append(await self._reconcile(row))
            self._cursor = row["id"]  # only once reconciled: a failed read tries it again
        await self._fill()
        self._watch.looked(now_ms())

    async def _fill(self) -> None:
        """Start resubmissions first, then the blocks from ``_next`` up to the head,
        while there is room."""
        for number in sorted(self._queued):
            if self._pump.room <= 0:
                return
            self._launch(self._queued.pop(number))
        head = await self._store.head()
        if head is None:
            return
        while self._pump.room > 0 and self._next <= head["number"]:
            top = min(head["number"], self._next + SCAN_AHEAD - 1)
            blocks = await canonical_blocks(self._store, self._next, top)
            stored = await self._store.seen_at(self._next, top)
            running = self._pump.running_keys()
            for number in range(self._next, top + 1):
                if self._pump.room <= 0:
                    return
                row = blocks.get(number)
                if row is None:
                    return  # the chain changed under the read: look again next tick
                self._next = number + 1
                if self._written.get(number) == row["block_hash"]:
                    continue
                if number in running or number in self._queued:
                    continue  # checked against the chain when it finishes
                self._launch(self._job(number, row, stored))

    def _job(self, number: int, row: Mapping[str, Any], stored: Mapping[int, int | None]) -> _Job:
        """A job for block ``number`` (``row``), a new lineage of attempts; ``stored``:
        when ingest stored blocks."""
        block_hash = row["block_hash"]
        original = f"{self._spec.task_prefix}{number}-{uuid.uuid4().hex[:12]}"
        attempt = self._pump.open(number, self._spec.task(number, block_hash), original)
        return _Job(number, block_hash, stored.get(number), now_ms(), attempt)

    def _launch(self, job: _Job) -> None:
        self._pump.start(job, job.attempt)

    def _rewind(self, number: int) -> None:
        """Look at ``number`` again when the chain holds it (again)."""
        if number >= self._start:
            self._next = min(self._next, number)

    # ---- outcomes ------------------------------------------------------------------

    async def _completed(self, job: _Job, result: TaskResult) -> FollowEvent | None:
        row = await self._store.block(job.number)
        current = None if row is None else row["block_hash"]
        if current != job.hash:
            # Its branch was abandoned while it ran: whatever it did, redo the block
            # on the chain as it is now, or remove it if the chain no longer has it.
            self._written.pop(job.number, None)
            if row is not None:
                stored = await self._store.seen_at(job.number, job.number)
                self._queued[job.number] = self._job(job.number, row, stored)
                return None
            self._pump.book.close(job.number)
            if verdict(result) is Verdict.DONE:
                await self._delete((job.number,))
                return BlocksDeleted(numbers=(job.number,))
            self._rewind(job.number)
            return None
        judged = self._pump.judge(job.attempt, result)
        if isinstance(judged, Succeeded):
            self._written[job.number] = job.hash
            now = now_ms()
            since, lag_from = (
                (job.seen_ms, LagFrom.FOLLOW)
                if job.stored_ms is None
                else (job.stored_ms, LagFrom.INGEST)
            )
            return BlockWritten(
                number=job.number,
                hash=job.hash,
                rows=_rows_of(result),
                task_id=result.task_id,
                attempt=job.attempt.number,
                lag_ms=now - since,
                lag_from=lag_from,
                seen_lag_ms=now - job.seen_ms,
            )
        failure = result.failure_message or result.error
        if isinstance(judged, Retrying):
            job.attempt = judged.next
            self._queued[job.number] = job
            return BlockRetrying(
                number=job.number,
                hash=job.hash,
                task_id=result.task_id,
                attempt=judged.attempt.number,
                failure_code=result.failure_code or "",
                failure_message=failure,
            )
        if self._spec.on_failure is OnFailure.STOP:
            self._halted = True
        return BlockFailed(
            number=job.number,
            hash=job.hash,
            task_id=result.task_id,
            attempt=judged.attempt.number,
            failure_code=result.failure_code or "",
            failure_message=failure,
        )

    # ---- reconciliation ------------------------------------------------------------

    async def _reconcile_ledger(self, reason: GapReason) -> LedgerReconciled:
        """The ledger over the window a reorg can reach, made to match the chain (read
        ``_LEDGER_PAGE`` blocks at a time: the finalized height may lag far behind)."""
        table = self._spec.sink_table
        head = await self._store.head()
        span = await self._sink.written_span(table, self._spec.chain_id)
        checked: list[int] = []
        rewritten: list[int] = []
        deleted: list[int] = []
        if head is not None and span is not None:
            low = reach(
                top=span[1],
                head=head["number"],
                finalized=head["finalized"],
                reorg_window=self._spec.reorg_window,
            )
            for first in range(max(low, span[0]), span[1] + 1, _LEDGER_PAGE):
                ledger = await written_hashes(
                    self._sink, table, self._spec.chain_id, first, first + _LEDGER_PAGE - 1
                )
                decision = await self._repair(ledger)
                checked.extend(ledger)
                rewritten.extend(decision.rewrite)
                deleted.extend(decision.delete)
        return LedgerReconciled(
            reason=reason,
            from_block=min(checked, default=None),
            to_block=max(checked, default=None),
            checked=len(checked),
            rewritten=tuple(rewritten),
            deleted=tuple(deleted),
        )

    async def _reconcile(self, reorg: Mapping[str, Any]) -> ReorgReconciled:
        fork = reorg["fork_block_number"]
        decision = await self._repair(
            await written_hashes(self._sink, self._spec.sink_table, self._spec.chain_id, fork + 1)
        )
        self._rewind(fork + 1)
        return ReorgReconciled(
            reorg_id=reorg["id"],
            fork_block_number=fork,
            depth=reorg["depth"],
            rewritten=tuple(decision.rewrite),
            deleted=decision.delete,
        )

    async def _repair(self, ledger: Mapping[int, str]) -> Reconciliation:
        """Compare ``ledger`` entries with the chain: delete the blocks it no longer
        holds, run again those written under another hash (a block under way is
        checked when it finishes)."""
        if not ledger:
            return Reconciliation()
        blocks = await canonical_blocks(self._store, min(ledger), max(ledger))
        decision = reconcile(ledger, {n: r["block_hash"] for n, r in blocks.items()})
        if decision.delete:
            await self._delete(decision.delete)
        stored: dict[int, int | None] = {}
        if decision.rewrite:
            stored = await self._store.seen_at(min(decision.rewrite), max(decision.rewrite))
        for number, block_hash in decision.rewrite.items():
            self._written.pop(number, None)
            queued = self._queued.get(number)
            if number not in self._pump.running_keys() and (
                queued is None or queued.hash != block_hash
            ):
                self._queued[number] = self._job(number, blocks[number], stored)
        return decision

    async def _delete(self, numbers: tuple[int, ...]) -> None:
        table, chain_id = self._spec.sink_table, self._spec.chain_id
        if self._sink_url is None:
            await self._sink.delete_blocks(table, chain_id, numbers)
        else:
            await delete_written(self._sink, self._sink_url, table, chain_id, numbers)
        for number in numbers:
            self._written.pop(number, None)
            self._rewind(number)


def _rows_of(result: TaskResult) -> int:
    if not result.plugin_results:
        return 0
    try:
        value = result.plugin_results[0].value()
    except ValueError:
        return 0
    rows = value.get("rows") if isinstance(value, dict) else None
    return rows if isinstance(rows, int) else 0


async def follow(
    client: Client,
    job: JobSpec,
    *,
    from_block: int | None = None,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    reorg_window: int = DEFAULT_REORG_WINDOW,
    stop: asyncio.Event | None = None,
    push: bool = True,
) -> AsyncIterator[FollowEvent]:
    """Follow the block database's head: ``job`` (``blockx_drive.JobSpec``: the
    function over the source table for each new block, written into the sink
    table by its writer) with reorgs reconciled. Yields a FollowStarted and the
    LedgerReconciled of the start, then BlockWritten / BlockRetrying / BlockFailed
    / ReorgReconciled / BlocksDeleted / LedgerReconciled / WatchInterrupted as they
    happen, until ``stop`` is set and the tasks under way have finished, or
    (``on_failure="stop"``) a block failed.

    ``from_block``: where to start (None: where the ledger says, see the module);
    ``poll_interval_s``: how often the block database is looked at, besides
    whenever ingest's commit wakes follow (``push``; False: polls only);
    ``reorg_window``: how far below its head follow compares the ledger with the
    chain on every start and after a gap. Before any task goes out, the source
    table, the sink's column types and the function are checked
    (``blockx_drive.submission``). The run keeps its job record in the sink
    (``blockx_drive.jobs``), naming ``job.command`` (default: this call) as what
    started it; its tasks' ids start with the record's ``task_prefix``. Follow
    reads, reconciles and deletes ``job.chain``'s ledger entries and rows only.

    Raises ValueError for arguments it cannot use (SubmissionRefused for a failed
    check), the stores' unavailable errors when a database cannot be reached at start,
    ClusterUnreachable (a ConnectError) when a block's attempts never reached the
    cluster, and InvalidRequestError when the cluster refuses the task."""
    checked = check(job, writer=DEFAULT_FOLLOW_WRITER)
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
    if from_block is not None:
        check_block_number("from_block", from_block)
    check_bounded("reorg_window", reorg_window, REORG_WINDOW_LIMIT)
    block_db, sink_db = checked.block_db, checked.sink_db
    function, source_table, sink_table = job.function, job.source_table, job.sink_table
    job_id = new_job_id(JobKind.FOLLOW)
    spec = FollowSpec(
        job, checked, job_id=job_id, reorg_window=reorg_window, poll_interval_s=poll_interval_s
    )
    command = command_of(
        job,
        checked,
        "follow",
        (
            *("function", "source_table", "where", "unit", "sink_table", "from_block"),
            *("db_url", "sink_db_url", "writer_config", "chain", "abi", "event"),
        ),
        {"from_block": from_block},
    )
    store = await open_store(block_db, read_only=True)
    try:
        sink = await open_sink(sink_db)
        stack = contextlib.AsyncExitStack()
        try:
            await check_sink(sink, sink_table, spec.writer_config)
            unchecked = await check_function(client, function)
            # A Worker whose sink is another database refuses the tasks (PLUGIN_FAILED).
            spec.writer_config["sinkIdentity"] = await sink.identity()
            # A Worker whose task chain is another chain refuses them too.
            spec.chain_id = spec.writer_config["chainId"] = await planning_chain(store, sink)
            await catch_up_lake(sink_db, sink_table)
            changes = store.changes() if push else contextlib.nullcontext(None)
            changed = await stack.enter_async_context(changes)
            follower = Follower(client, store, sink, spec, sink_db, changed)
            started, reconciled = await follower.open(from_block)
            started = msgspec.structs.replace(started, function_unchecked=unchecked)
            progress = FollowProgress()
            first = new_record(
                JobKind.FOLLOW,
                job_id=job_id,
                command=command,
                function=function,
                source_table=source_table,
                sink_table=sink_table,
                chain=job.chain,
                chain_id=spec.chain_id,
                now_ms=now_ms(),
            )
            record = progress.fold(first, started, now_ms())
            events = follower.events(stop or asyncio.Event())
            async with JobRecorder(sink, record) as recorder, contextlib.aclosing(events):
                yield started
                recorder.update(progress.fold(recorder.record, reconciled, now_ms()))
                yield reconciled
                async for happened in events:
                    recorder.update(progress.fold(recorder.record, happened, now_ms()))
                    yield happened
        finally:
            await stack.aclose()
            await sink.close()
    finally:
        await store.close()
