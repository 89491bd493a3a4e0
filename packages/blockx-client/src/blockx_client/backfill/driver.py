"""``backfill``: run a block range through the bundle cluster into a sink table.

The range is cut into BlockBundleCallConfig tasks of ``blocks_per_task`` blocks
(``plan``), of which at most ``tasks_in_flight`` run at a time. A task whose
attempt fails retryably (or whose fate the client could not learn: a Worker
killed, a connection cut) runs again under a new task_id of its lineage, after a
back-off (``blockx_client.resubmit``), up to ``max_attempts`` attempts. Every
finished attempt is reported as it ends; the iteration ends with the summary. A
task that failed for good is reported, and the backfill goes on with the other
tasks or (``on_failure="stop"``) ends there, the waits of the attempts under way
cancelled. A task whose attempts all went without an answer from the cluster
ends the backfill with ClusterUnreachable: the other tasks would fare no better.

BlockX itself generates no tasks: this is a client, and the task model stays the
Coordinator/Worker one. Stopping the iteration early (``aclose``, cancellation)
cancels the waits of the attempts under way; what they wrote stays written and a
re-run skips it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from blockx_chain.sink import SinkRejected, open_sink, read_identity
from blockx_chain.sink.schema import parse_types
from blockx_chain.store import open_store
from blockx_chain.url import BlockDbUrl, parse_blockdb_url
from blockx_client.backfill.plan import (
    DEFAULT_BLOCKS_PER_TASK,
    UNITS,
    BackfillError,
    BackfillPlan,
    TaskRange,
    bundle_task,
    missing_block,
    plan,
    split,
)
from blockx_client.backfill.progress import (
    BackfillEvent,
    BackfillPlanned,
    Tally,
    TaskFinished,
    TaskOutcome,
)
from blockx_client.ledger import canonical_hashes, written_hashes
from blockx_client.models import Task, TaskResult
from blockx_client.resubmit import (
    DEFAULT_MAX_ATTEMPTS,
    OnFailure,
    Verdict,
    check_attempts,
    out_of_reach,
    retry_delay_s,
    run_attempt,
    unanswered,
    verdict,
)

if TYPE_CHECKING:
    from blockx_client.client import Client

DEFAULT_TASKS_IN_FLIGHT = 4
DEFAULT_BACKFILL_WRITER = "BlockBundleWriteResultHandler"


def as_url(url: str | BlockDbUrl, what: str) -> BlockDbUrl:
    if isinstance(url, str):
        try:
            return parse_blockdb_url(url)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    return url


def writer_config_for(writer_config: Mapping[str, Any] | None, sink_table: str) -> dict[str, Any]:
    """The writer's config: ``writer_config`` with ``{"table": sink_table}``; its
    ``columns`` (name → INTEGER, TEXT, REAL, NUMERIC or JSON) are checked here, so a
    declaration the writer would refuse is refused before any task is submitted."""
    config = {**(writer_config or {}), "table": sink_table}
    columns = config.get("columns")
    if columns is not None:
        if not isinstance(columns, Mapping):
            raise ValueError(f"columns must map column names to types, got {columns!r}")
        try:
            parse_types(columns)
        except SinkRejected as exc:
            raise ValueError(f"columns: {exc}") from None
    return config


async def make_plan(
    *,
    db_url: BlockDbUrl,
    sink_db_url: BlockDbUrl,
    sink_table: str,
    from_block: int,
    to_block: int,
    blocks_per_task: int,
    force: bool,
) -> BackfillPlan:
    """The plan, from the block database's hashes and the sink's ledger, read one
    task range at a time so that a range of millions of blocks is never in memory."""
    ranges = split(from_block, to_block, blocks_per_task)
    run: list[TaskRange] = []
    skipped: list[TaskRange] = []
    store = await open_store(db_url, read_only=True)
    try:
        sink = await open_sink(sink_db_url)
        try:
            for task_range in ranges:
                first, last = task_range.from_block, task_range.to_block
                canonical = await canonical_hashes(store, first, last)
                missing = missing_block(first, last, canonical)
                if missing is not None:
                    head = await store.head()
                    at = "nothing ingested" if head is None else f"its head is {head['number']}"
                    raise BackfillError(
                        f"block {missing} is not in the block database ({at}): ingest it "
                        "first (blockx chain ingest) or lower --to"
                    )
                written = await written_hashes(sink, sink_table, first, last)
                part = plan([task_range], canonical, written, force=force)
                run.extend(part.run)
                skipped.extend(part.skipped)
        finally:
            await sink.close()
    finally:
        await store.close()
    return BackfillPlan(
        from_block=from_block, to_block=to_block, run=tuple(run), skipped=tuple(skipped)
    )


class _Attempt:
    __slots__ = ("attempt", "original", "range", "started", "task")

    def __init__(self, task_range: TaskRange, task: Task, original: str, attempt: int) -> None:
        self.range = task_range
        self.task = task
        self.original = original
        self.attempt = attempt
        self.started = 0.0


async def _run(client: Client, attempt: _Attempt) -> TaskResult:
    await asyncio.sleep(retry_delay_s(attempt.attempt))
    attempt.started = time.monotonic()
    return await run_attempt(client, attempt.task, attempt.original, attempt.attempt)


def _written_counts(result: TaskResult, task_range: TaskRange) -> tuple[int, int]:
    """Blocks and rows from the writer's output (``{"blocks", "rows", ...}``); a
    writer that reports no counts is taken to have written the range's blocks."""
    value: Any = None
    if result.plugin_results:
        try:
            value = result.plugin_results[0].value()
        except ValueError:
            value = None
    if not isinstance(value, dict):
        return task_range.blocks, 0
    blocks = value.get("blocks", task_range.blocks)
    rows = value.get("rows", 0)
    return (
        blocks if isinstance(blocks, int) else task_range.blocks,
        rows if isinstance(rows, int) else 0,
    )


async def backfill(
    client: Client,
    *,
    function: str,
    source_table: str,
    from_block: int,
    to_block: int,
    sink_table: str,
    db_url: str | BlockDbUrl,
    sink_db_url: str | BlockDbUrl,
    where: Mapping[str, Any] | None = None,
    unit: str = "row",
    blocks_per_task: int = DEFAULT_BLOCKS_PER_TASK,
    bundle_size: int | None = None,
    tasks_in_flight: int = DEFAULT_TASKS_IN_FLIGHT,
    writer: str = DEFAULT_BACKFILL_WRITER,
    writer_config: Mapping[str, Any] | None = None,
    force: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    on_failure: OnFailure | str = OnFailure.CONTINUE,
) -> AsyncIterator[BackfillEvent]:
    """Backfill ``[from_block, to_block]``: ``function`` over ``source_table`` of the
    block database (``db_url``) into ``sink_table`` of the sink (``sink_db_url``,
    the one the bundle Workers write, SINK_DB_URL). Yields a BackfillPlanned, a
    TaskFinished per finished attempt, and a BackfillDone last. ``writer_config``
    adds writer options (``key``, ``columns``) to ``{"table": sink_table}``. A task
    is attempted at most ``max_attempts`` times; after one failed for good the
    backfill goes on (``on_failure="continue"``) or ends (``"stop"``).

    Raises ValueError for arguments it cannot use, BackfillError when a block of the
    range is not in the block database, the stores' unavailable errors when a
    database cannot be reached, ClusterUnreachable (a ConnectError) when a task's
    attempts never reached the cluster, and InvalidRequestError when the cluster
    refuses the task (no bundle coordinator configured)."""
    if unit not in UNITS:
        raise ValueError(f"unit must be row or block, got {unit!r}")
    if tasks_in_flight < 1:
        raise ValueError(f"tasks_in_flight must be >= 1, got {tasks_in_flight}")
    after_failure = check_attempts(max_attempts, on_failure)
    if bundle_size is not None and bundle_size < 1:
        raise ValueError(f"bundle_size must be >= 1, got {bundle_size}")
    config = writer_config_for(writer_config, sink_table)
    started = time.monotonic()
    planned = await make_plan(
        db_url=as_url(db_url, "db_url"),
        sink_db_url=as_url(sink_db_url, "sink_db_url"),
        sink_table=sink_table,
        from_block=from_block,
        to_block=to_block,
        blocks_per_task=blocks_per_task,
        force=force,
    )
    header = BackfillPlanned(
        from_block=planned.from_block,
        to_block=planned.to_block,
        tasks=len(planned.run),
        blocks=sum(r.blocks for r in planned.run),
        skipped_tasks=len(planned.skipped),
        skipped_blocks=sum(r.blocks for r in planned.skipped),
    )
    yield header
    tally = Tally(header, started)
    # A Worker whose sink is another database refuses the tasks (PLUGIN_FAILED).
    config["sinkIdentity"] = await read_identity(as_url(sink_db_url, "sink_db_url"))
    pending: deque[_Attempt] = deque()
    for task_range in planned.run:
        task = bundle_task(
            task_range,
            function=function,
            source_table=source_table,
            where=where,
            unit=unit,
            bundle_size=bundle_size,
            writer=writer,
            writer_config=config,
        )
        pending.append(_Attempt(task_range, task, f"backfill-{uuid.uuid4()}", 1))
    running: dict[asyncio.Task[TaskResult], _Attempt] = {}
    stopped = False  # a task failed for good and on_failure is STOP
    try:
        while (pending or running) and not stopped:
            while pending and len(running) < tasks_in_flight:
                attempt = pending.popleft()
                running[asyncio.create_task(_run(client, attempt))] = attempt
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for finished in sorted(done, key=lambda t: running[t].range.from_block):
                attempt = running.pop(finished)
                result = finished.result()  # InvalidRequestError ends the backfill
                event = _finished(attempt, result, max_attempts)
                if event.outcome is TaskOutcome.RETRYING:
                    # Next in line, so a range is not left behind the rest.
                    pending.appendleft(
                        _Attempt(attempt.range, attempt.task, attempt.original, attempt.attempt + 1)
                    )
                yield tally.record(event, time.monotonic())
                if event.outcome is TaskOutcome.FAILED:
                    if unanswered(result):
                        what = f"blocks {event.from_block}..{event.to_block}"
                        raise out_of_reach(what, event.attempt, result)
                    # The attempts under way are cancelled below; the summary
                    # counts the tasks this leaves unfinished.
                    stopped = after_failure is OnFailure.STOP
    finally:
        for waiting in running:
            waiting.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    yield tally.summary(time.monotonic())


def _finished(attempt: _Attempt, result: TaskResult, max_attempts: int) -> TaskFinished:
    judged = verdict(result)
    blocks = rows = 0
    if judged is Verdict.DONE:
        outcome = TaskOutcome.WRITTEN
        blocks, rows = _written_counts(result, attempt.range)
    elif judged is Verdict.RETRY and attempt.attempt < max_attempts:
        outcome = TaskOutcome.RETRYING
    else:
        outcome = TaskOutcome.FAILED
    return TaskFinished(
        task_id=result.task_id,
        original_task_id=attempt.original,
        attempt=attempt.attempt,
        from_block=attempt.range.from_block,
        to_block=attempt.range.to_block,
        outcome=outcome,
        blocks=blocks,
        rows=rows,
        failure_code=result.failure_code,
        failure_message=result.failure_message or result.error,
        seconds=time.monotonic() - attempt.started if attempt.started else 0.0,
    )
