"""A follow's events folded into its job record (``blockx_drive.jobs``)."""

from __future__ import annotations

from collections import deque
from typing import Final, assert_never

import msgspec

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
from blockx_drive.job_progress import highest, with_failure
from blockx_drive.jobs import MAX_MESSAGE, JobProgress

# Blocks/s: the blocks written over the last minute.
RATE_WINDOW_MS: Final = 60_000


class FollowProgress:
    """Folds a follow's events into its record; blocks/s counts the blocks written
    over the last RATE_WINDOW_MS (or since the start, when that is shorter)."""

    def __init__(self) -> None:
        self._written_at: deque[int] = deque()

    def _rate(self, job: JobProgress, now_ms: int) -> float:
        while self._written_at and self._written_at[0] <= now_ms - RATE_WINDOW_MS:
            self._written_at.popleft()
        window_ms = min(RATE_WINDOW_MS, max(now_ms - job.started_ms, 1))
        return len(self._written_at) * 1000 / window_ms

    def fold(self, job: JobProgress, event: FollowEvent, now_ms: int) -> JobProgress:
        replace = msgspec.structs.replace
        match event:
            case FollowStarted():
                return replace(job, updated_ms=now_ms, from_block=event.from_block, head=event.head)
            case BlockWritten():
                self._written_at.append(now_ms)
                return replace(
                    job,
                    updated_ms=now_ms,
                    blocks_done=job.blocks_done + 1,
                    rows_done=job.rows_done + event.rows,
                    tasks_done=job.tasks_done + 1,
                    blocks_per_s=self._rate(job, now_ms),
                    head=highest(job.head, event.number),
                    last_block=highest(job.last_block, event.number),
                    lag_ms=event.lag_ms,
                    lag_from=event.lag_from,
                )
            case BlockFailed():
                message = f"{event.failure_code}: {event.failure_message}"
                return replace(
                    job,
                    updated_ms=now_ms,
                    tasks_failed=job.tasks_failed + 1,
                    head=highest(job.head, event.number),
                    failures=with_failure(
                        job, event, from_block=event.number, to_block=event.number, at_ms=now_ms
                    ),
                    message=f"block {event.number}: {message}"[:MAX_MESSAGE],
                )
            case BlockRetrying():
                return replace(job, updated_ms=now_ms, retries=job.retries + 1)
            case ReorgReconciled() | BlocksDeleted() | LedgerReconciled() | WatchInterrupted():
                return replace(job, updated_ms=now_ms, blocks_per_s=self._rate(job, now_ms))
            case _:
                assert_never(event)
