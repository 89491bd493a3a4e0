"""``follow``: keep a sink table computed for every new block, reorgs included.

Follow polls the block database (kept fresh by ``blockx chain ingest --follow``):

* every new block gets one BlockTableCallConfig task on the block cluster, pinned
  to the block's hash (``{"number", "hash"}``), submitted in block order with at
  most ``tasks_in_flight`` under way; a retryable failure runs again under a new
  task_id of its lineage (``blockx_client.resubmit``);
* every row of ``reorgs`` above its cursor (the last id seen) is reconciled: the
  ledger entries above the fork are compared with the canonical chain, blocks
  written on the abandoned branch run again on the new one, and blocks above the
  new head (a shorter branch) have their rows and ledger entries deleted;
* every finished task is checked against the chain as it is then: a block writer
  checks canonicity before it commits, but where the sink and the block database
  are different databases that check cannot be atomic with the commit, so a block
  written, or failed, on a branch abandoned meanwhile is run again (or deleted).

It starts at ``from_block`` or, without it, at the oldest gap among the last
``RESUME_WINDOW`` blocks of the ledger (after the highest written block when
there is none), or at the head on an empty ledger. Blocks already in the ledger
with their canonical hash are skipped. Ledger entries below where it starts are
not examined. It runs until ``stop`` is set (then the tasks under way finish and
are reported) or the iteration is closed (then their waits are cancelled).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.store import BlockStore, open_store
from blockx_chain.url import BlockDbUrl
from blockx_client.backfill.driver import as_url
from blockx_client.backfill.plan import UNITS
from blockx_client.follow.events import (
    BlockFailed,
    BlockRetrying,
    BlocksDeleted,
    BlockWritten,
    FollowEvent,
    FollowStarted,
    ReorgReconciled,
)
from blockx_client.follow.spec import FollowSpec
from blockx_client.ledger import canonical_blocks, reconcile, written_hashes
from blockx_client.models import TaskResult
from blockx_client.resubmit import (
    Verdict,
    retry_delay_s,
    run_attempt,
    verdict,
)

if TYPE_CHECKING:
    from blockx_client.client import Client

RESUME_WINDOW: Final = 1000
# How long a stopped follow waits for the tasks under way before it cancels them.
STOP_GRACE_S: Final = 15.0
# Blocks read from the block database at a time while catching up.
SCAN_AHEAD: Final = 64
_REORG_PAGE: Final = 1000


class _Job:
    """One block on one hash, and the attempt it is at."""

    __slots__ = ("attempt", "hash", "number", "original", "seen_ms", "task", "timestamp_s")

    def __init__(
        self, spec: FollowSpec, number: int, block_hash: str, timestamp_s: int, seen_ms: int
    ) -> None:
        self.number = number
        self.hash = block_hash
        self.timestamp_s = timestamp_s
        self.seen_ms = seen_ms
        self.task = spec.task(number, block_hash)
        self.original = f"follow-{number}-{uuid.uuid4()}"
        self.attempt = 1

    def again(self) -> _Job:
        self.attempt += 1
        return self


def _now_ms() -> int:
    return int(time.time() * 1000)


class Follower:
    """The state of one follow run; ``events`` drives it."""

    def __init__(
        self, client: Client, store: BlockStore, sink: SinkStore, spec: FollowSpec
    ) -> None:
        self._client = client
        self._store = store
        self._sink = sink
        self._spec = spec
        self._start = 0
        self._next = 0
        self._cursor = 0
        # The ledger as this run knows it, for blocks from where it started.
        self._written: dict[int, str] = {}
        self._running: dict[asyncio.Task[TaskResult], _Job] = {}
        self._running_numbers: set[int] = set()
        # Resubmissions waiting for a free place, by block number.
        self._queued: dict[int, _Job] = {}

    # ---- start ---------------------------------------------------------------------

    async def open(self, from_block: int | None) -> tuple[FollowStarted, BlocksDeleted | None]:
        table = self._spec.sink_table
        head = await self._store.head()
        self._cursor = await self._last_reorg_id()
        if from_block is not None:
            start = from_block
        else:
            span = await self._sink.written_span(table)
            if span is not None:
                low, high = span
                start = self._oldest_gap(
                    await written_hashes(self._sink, table, max(low, high - RESUME_WINDOW + 1)),
                    max(low, high - RESUME_WINDOW + 1),
                    high,
                )
            else:
                start = 0 if head is None else head["number"]
        self._start = self._next = start
        self._written = await written_hashes(self._sink, table, start)
        deleted = None
        if head is not None:
            above = tuple(n for n in sorted(self._written) if n > head["number"])
            if above:
                await self._delete(above)
                deleted = BlocksDeleted(numbers=above)
        started = FollowStarted(
            from_block=start,
            head=None if head is None else head["number"],
            reorg_cursor=self._cursor,
        )
        return started, deleted

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

    async def events(self, stop: asyncio.Event) -> AsyncIterator[FollowEvent]:
        stopper = asyncio.ensure_future(stop.wait())
        give_up_at: float | None = None
        try:
            while True:
                if not stop.is_set():
                    for row in await self._store.reorgs(self._cursor, _REORG_PAGE):
                        self._cursor = row["id"]
                        yield await self._reconcile(row)
                    await self._fill()
                if stop.is_set():  # (it may have been set during the reads above)
                    if give_up_at is None:
                        give_up_at = time.monotonic() + STOP_GRACE_S
                    if not self._running or time.monotonic() > give_up_at:
                        return  # what still runs is cancelled below; a restart resumes it
                waiting: set[asyncio.Future[Any]] = set(self._running)
                if not stop.is_set():
                    waiting.add(stopper)
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=self._spec.poll_interval_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                finished = [t for t in self._running if t in done]
                for task in sorted(finished, key=lambda t: self._running[t].number):
                    job = self._running.pop(task)
                    self._running_numbers.discard(job.number)
                    event = await self._completed(job, task.result())
                    if event is not None:
                        yield event
        finally:
            stopper.cancel()
            for task in self._running:
                task.cancel()
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)

    async def _fill(self) -> None:
        """Start resubmissions first, then the blocks from ``_next`` up to the head,
        while there is room."""
        room = self._spec.tasks_in_flight
        for number in sorted(self._queued):
            if len(self._running) >= room:
                return
            self._launch(self._queued.pop(number))
        head = await self._store.head()
        if head is None:
            return
        while len(self._running) < room and self._next <= head["number"]:
            top = min(head["number"], self._next + SCAN_AHEAD - 1)
            blocks = await canonical_blocks(self._store, self._next, top)
            for number in range(self._next, top + 1):
                if len(self._running) >= room:
                    return
                row = blocks.get(number)
                if row is None:
                    return  # the chain changed under the read: look again next tick
                self._next = number + 1
                if self._written.get(number) == row["block_hash"]:
                    continue
                if number in self._running_numbers or number in self._queued:
                    continue  # checked against the chain when it finishes
                self._launch(self._job(number, row))

    def _job(self, number: int, row: Mapping[str, Any]) -> _Job:
        return _Job(self._spec, number, row["block_hash"], row["timestamp"], _now_ms())

    def _launch(self, job: _Job) -> None:
        async def run() -> TaskResult:
            await asyncio.sleep(retry_delay_s(job.attempt))
            return await run_attempt(self._client, job.task, job.original, job.attempt)

        self._running[asyncio.create_task(run())] = job
        self._running_numbers.add(job.number)

    def _rewind(self, number: int) -> None:
        """Look at ``number`` again when the chain holds it (again)."""
        if number >= self._start:
            self._next = min(self._next, number)

    # ---- outcomes ------------------------------------------------------------------

    async def _completed(self, job: _Job, result: TaskResult) -> FollowEvent | None:
        judged = verdict(result)  # InvalidRequestError was raised by the task itself
        row = await self._store.block(job.number)
        current = None if row is None else row["block_hash"]
        if current != job.hash:
            # Its branch was abandoned while it ran: whatever it did, redo the block
            # on the chain as it is now, or remove it if the chain no longer has it.
            self._written.pop(job.number, None)
            if row is not None:
                self._queued[job.number] = self._job(job.number, row)
                return None
            self._rewind(job.number)
            if judged is Verdict.DONE:
                await self._delete((job.number,))
                return BlocksDeleted(numbers=(job.number,))
            return None
        if judged is Verdict.DONE:
            self._written[job.number] = job.hash
            now = _now_ms()
            return BlockWritten(
                number=job.number,
                hash=job.hash,
                rows=_rows_of(result),
                task_id=result.task_id,
                attempt=job.attempt,
                lag_ms=now - job.timestamp_s * 1000,
                seen_lag_ms=now - job.seen_ms,
            )
        limit = self._spec.max_attempts
        if judged is Verdict.RETRY and (limit is None or job.attempt < limit):
            retrying = BlockRetrying(
                number=job.number,
                hash=job.hash,
                task_id=result.task_id,
                attempt=job.attempt,
                failure_code=result.failure_code,
                failure_message=result.failure_message or result.error,
            )
            self._queued[job.number] = job.again()
            return retrying
        return BlockFailed(
            number=job.number,
            hash=job.hash,
            task_id=result.task_id,
            attempt=job.attempt,
            failure_code=result.failure_code,
            failure_message=result.failure_message or result.error,
        )

    async def _reconcile(self, reorg: Mapping[str, Any]) -> ReorgReconciled:
        fork = reorg["fork_block_number"]
        ledger = await written_hashes(self._sink, self._spec.sink_table, fork + 1)
        blocks = await canonical_blocks(self._store, fork + 1, max(ledger, default=fork))
        decision = reconcile(ledger, {n: r["block_hash"] for n, r in blocks.items()})
        if decision.delete:
            await self._delete(decision.delete)
        for number in decision.rewrite:
            self._written.pop(number, None)
            if number not in self._running_numbers:
                self._queued[number] = self._job(number, blocks[number])
        self._rewind(fork + 1)
        return ReorgReconciled(
            reorg_id=reorg["id"],
            fork_block_number=fork,
            depth=reorg["depth"],
            rewritten=tuple(decision.rewrite),
            deleted=decision.delete,
        )

    async def _delete(self, numbers: tuple[int, ...]) -> None:
        await self._sink.delete_blocks(self._spec.sink_table, numbers)
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


# A head query costs well under a millisecond; this wait is most of a block's lag.
DEFAULT_POLL_INTERVAL_S: Final = 0.1
DEFAULT_FOLLOW_TASKS_IN_FLIGHT: Final = 4
DEFAULT_FOLLOW_WRITER: Final = "BlockWriteResultHandler"


async def follow(
    client: Client,
    *,
    function: str,
    source_table: str,
    sink_table: str,
    db_url: str | BlockDbUrl,
    sink_db_url: str | BlockDbUrl,
    where: Mapping[str, Any] | None = None,
    unit: str = "row",
    from_block: int | None = None,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    writer: str = DEFAULT_FOLLOW_WRITER,
    writer_config: Mapping[str, Any] | None = None,
    tasks_in_flight: int = DEFAULT_FOLLOW_TASKS_IN_FLIGHT,
    max_attempts: int | None = None,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[FollowEvent]:
    """Follow the block database's head: ``function`` over ``source_table`` for each
    new block, written into ``sink_table`` of the sink (``sink_db_url``, the one the
    block Workers write, SINK_DB_URL) by ``writer``, reorgs reconciled. Yields a
    FollowStarted, then BlockWritten / BlockFailed / ReorgReconciled / BlocksDeleted
    as they happen, until ``stop`` is set and the tasks under way have finished.

    A retryable failure is resubmitted until it succeeds (a block is never skipped
    because the cluster or the sink is down for a while) unless ``max_attempts``
    bounds it. Raises ValueError for arguments it cannot use, the stores' unavailable errors
    when a database cannot be reached, and InvalidRequestError when the cluster
    refuses the task."""
    if unit not in UNITS:
        raise ValueError(f"unit must be row or block, got {unit!r}")
    if tasks_in_flight < 1:
        raise ValueError(f"tasks_in_flight must be >= 1, got {tasks_in_flight}")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1 or None, got {max_attempts}")
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
    if from_block is not None and (isinstance(from_block, bool) or from_block < 0):
        raise ValueError(f"from_block must be a block number, got {from_block!r}")
    spec = FollowSpec(
        function=function,
        source_table=source_table,
        where=where,
        unit=unit,
        sink_table=sink_table,
        writer=writer,
        writer_config=writer_config,
        tasks_in_flight=tasks_in_flight,
        max_attempts=max_attempts,
        poll_interval_s=poll_interval_s,
    )
    store = await open_store(as_url(db_url, "db_url"))
    try:
        sink = await open_sink(as_url(sink_db_url, "sink_db_url"))
        try:
            # A Worker whose sink is another database refuses the tasks (PLUGIN_FAILED).
            spec.writer_config["sinkIdentity"] = await sink.identity()
            follower = Follower(client, store, sink, spec)
            started, deleted = await follower.open(from_block)
            yield started
            if deleted is not None:
                yield deleted
            async for event in follower.events(stop or asyncio.Event()):
                yield event
        finally:
            await sink.close()
    finally:
        await store.close()
