"""From a backfill's or a follow's events to its ``JobProgress`` record.

``backfill_progress`` and ``follow_progress`` fold one event into the record;
``published`` passes a driver's events through unchanged while it publishes the
record folded by one of them, so the CLI, the demo and any SDK user publish the same way:

    async with JobPublisher(endpoints, JobKind.BACKFILL) as publisher:
        async for event in published(backfill(client, ...), publisher, backfill_progress):
            ...
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar, assert_never

import msgspec

from blockx_client.backfill.progress import (
    BackfillDone,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
)
from blockx_client.follow.events import (
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
from blockx_client.jobs import JobProgress, JobPublisher, JobState

E = TypeVar("E")


def new_record(
    publisher: JobPublisher, *, function: str = "", sink_table: str = "", now_ms: int
) -> JobProgress:
    return JobProgress(
        job_id=publisher.job_id,
        kind=publisher.kind,
        state=JobState.RUNNING,
        started_ms=now_ms,
        updated_ms=now_ms,
        function=function,
        sink_table=sink_table,
    )


def backfill_progress(job: JobProgress, event: BackfillEvent, now_ms: int) -> JobProgress:
    replace = msgspec.structs.replace
    match event:
        case BackfillPlanned():
            return replace(
                job,
                updated_ms=now_ms,
                from_block=event.from_block,
                to_block=event.to_block,
                blocks_total=event.blocks,
            )
        case TaskFinished():
            last = event.to_block if event.outcome is TaskOutcome.WRITTEN else None
            return replace(
                job,
                updated_ms=now_ms,
                blocks_done=event.blocks_done,
                rows_done=event.rows_done,
                tasks_done=event.tasks_done,
                tasks_failed=event.tasks_failed,
                retries=job.retries + (event.outcome is TaskOutcome.RETRYING),
                blocks_per_s=event.blocks_per_s,
                eta_s=event.eta_s,
                last_block=_highest(job.last_block, last),
                message=event.failure_message[:500] or job.message,
            )
        case BackfillDone():
            return replace(
                job,
                updated_ms=now_ms,
                state=JobState.FAILED if event.failed else JobState.DONE,
                blocks_done=event.blocks,
                rows_done=event.rows,
                tasks_failed=event.failed,
                retries=event.retries,
                blocks_per_s=event.blocks_per_s,
                eta_s=0.0,
            )
        case _:
            assert_never(event)


def follow_progress(job: JobProgress, event: FollowEvent, now_ms: int) -> JobProgress:
    replace = msgspec.structs.replace
    match event:
        case FollowStarted():
            return replace(job, updated_ms=now_ms, from_block=event.from_block, head=event.head)
        case BlockWritten():
            return replace(
                job,
                updated_ms=now_ms,
                blocks_done=job.blocks_done + 1,
                rows_done=job.rows_done + event.rows,
                tasks_done=job.tasks_done + 1,
                head=_highest(job.head, event.number),
                last_block=_highest(job.last_block, event.number),
                lag_ms=event.lag_ms,
            )
        case BlockFailed():
            return replace(
                job,
                updated_ms=now_ms,
                tasks_failed=job.tasks_failed + 1,
                head=_highest(job.head, event.number),
                message=f"block {event.number}: {event.failure_code}: {event.failure_message}"[
                    :500
                ],
            )
        case BlockRetrying():
            return replace(job, updated_ms=now_ms, retries=job.retries + 1)
        case ReorgReconciled() | BlocksDeleted() | LedgerReconciled() | WatchInterrupted():
            return replace(job, updated_ms=now_ms)
        case _:
            assert_never(event)


def finished(job: JobProgress, now_ms: int) -> JobProgress:
    """A follow that stopped as asked: done, unless it failed."""
    if job.state is not JobState.RUNNING:
        return job
    return msgspec.structs.replace(job, state=JobState.DONE, updated_ms=now_ms)


async def published(
    events: AsyncIterator[E],
    publisher: JobPublisher,
    fold: Callable[[JobProgress, E, int], JobProgress],
    *,
    function: str = "",
    sink_table: str = "",
) -> AsyncIterator[E]:
    """``events`` unchanged, each folded into the job's record and published. A
    follow that ends without an error is recorded as done."""
    job = new_record(publisher, function=function, sink_table=sink_table, now_ms=_now_ms())
    await publisher.publish(job)
    async for event in events:
        job = fold(job, event, _now_ms())
        await publisher.publish(job)
        yield event
    await publisher.publish(finished(job, _now_ms()))


def _highest(current: int | None, seen: int | None) -> int | None:
    if seen is None:
        return current
    return seen if current is None else max(current, seen)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
