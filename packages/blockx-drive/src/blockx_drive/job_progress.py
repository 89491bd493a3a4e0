"""What a backfill's and a follow's job records share: a run's first record, the
bounded list of its failures. ``blockx_drive._backfill.record`` and
``blockx_drive._follow.record`` fold each driver's events into its record; the
drivers hand it to their ``JobRecorder`` (``blockx_drive.jobs``).
"""

from __future__ import annotations

from typing import Protocol

from blockx_drive.jobs import (
    MAX_FAILURES,
    MAX_MESSAGE,
    JobFailure,
    JobKind,
    JobProgress,
    JobState,
    redacted,
)


def task_prefix(job_id: str) -> str:
    """What every task id of the job ``job_id`` starts with."""
    return f"{job_id}-"


def new_record(
    kind: JobKind,
    *,
    job_id: str,
    command: str,
    function: str,
    source_table: str,
    sink_table: str,
    chain: str | None,
    chain_id: int,
    now_ms: int,
) -> JobProgress:
    return JobProgress(
        job_id=job_id,
        kind=kind,
        state=JobState.RUNNING,
        started_ms=now_ms,
        updated_ms=now_ms,
        command=redacted(command),
        function=function,
        source_table=source_table,
        sink_table=sink_table,
        chain=chain or "",
        chain_id=chain_id,
        task_prefix=task_prefix(job_id),
    )


class Failed(Protocol):
    """An event of a task that failed for good (``TaskFinished``, ``BlockFailed``)."""

    @property
    def task_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def failure_code(self) -> str: ...
    @property
    def failure_message(self) -> str: ...


def with_failure(
    job: JobProgress, failed: Failed, *, from_block: int, to_block: int, at_ms: int
) -> tuple[JobFailure, ...]:
    """The record's failures with ``failed``'s (of blocks ``from_block`` to
    ``to_block``), the last MAX_FAILURES, each message bounded."""
    failure = JobFailure(
        at_ms=at_ms,
        from_block=from_block,
        to_block=to_block,
        task_id=failed.task_id,
        attempt=failed.attempt,
        code=failed.failure_code,
        message=failed.failure_message[:MAX_MESSAGE],
    )
    return (*job.failures, failure)[-MAX_FAILURES:]


def highest(current: int | None, seen: int | None) -> int | None:
    if seen is None:
        return current
    return seen if current is None else max(current, seen)
