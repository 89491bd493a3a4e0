"""What a backfill reports as it goes: one event per finished attempt, a plan
before and a summary after. Events are tagged msgspec Structs: encoded as JSON
each is one object whose ``event`` field names it (``plan``, ``task``, ``done``)."""

from __future__ import annotations

import enum
import time

import msgspec


class TaskOutcome(enum.Enum):
    WRITTEN = "written"  # the task succeeded: its blocks are in the sink
    RETRYING = "retrying"  # this attempt failed; the task runs again under a new task_id
    FAILED = "failed"  # the task failed for good (not retryable, or out of attempts)


class BackfillPlanned(msgspec.Struct, frozen=True, kw_only=True, tag="plan", tag_field="event"):
    job_id: str  # the run's job record in the sink; its tasks' ids start with it
    from_block: int
    to_block: int
    tasks: int  # tasks to run
    blocks: int  # blocks those tasks cover
    skipped_tasks: int  # ranges already written for the current block hashes
    skipped_blocks: int
    # Why the function was not checked before any task went out ("" when it was).
    function_unchecked: str = ""


class TaskFinished(msgspec.Struct, frozen=True, kw_only=True, tag="task", tag_field="event"):
    task_id: str
    original_task_id: str
    attempt: int
    from_block: int
    to_block: int
    outcome: TaskOutcome
    blocks: int  # blocks written by this attempt (0 unless WRITTEN)
    rows: int  # rows written by this attempt
    failure_code: str = ""
    failure_message: str = ""
    seconds: float = 0.0  # this attempt's run time
    # Running totals of the whole backfill after this event.
    blocks_done: int = 0
    rows_done: int = 0
    tasks_done: int = 0
    tasks_failed: int = 0
    blocks_per_s: float = 0.0
    rows_per_s: float = 0.0
    eta_s: float | None = None  # None until a block is written


class BackfillDone(msgspec.Struct, frozen=True, kw_only=True, tag="done", tag_field="event"):
    blocks: int  # blocks written
    rows: int  # rows written
    tasks: int  # tasks that ran to an end (written or failed), skipped ones not counted
    failed: int  # tasks that failed for good
    seconds: float
    skipped: int = 0  # tasks skipped as already written
    retries: int = 0  # attempts beyond each task's first
    blocks_per_s: float = 0.0
    rows_per_s: float = 0.0
    # Tasks never taken to an end: the backfill stopped after a task failed for
    # good (``on_failure="stop"``); a re-run runs them.
    unfinished: int = 0


BackfillEvent = BackfillPlanned | TaskFinished | BackfillDone


class Tally:
    """The running totals behind the events; the clock is read by the caller."""

    def __init__(self, planned: BackfillPlanned, started: float | None = None) -> None:
        self.planned = planned
        self.started = time.monotonic() if started is None else started
        self.blocks = 0
        self.rows = 0
        self.done = 0
        self.failed = 0
        self.retries = 0

    def seconds(self, now: float) -> float:
        return max(now - self.started, 1e-9)

    def record(self, event: TaskFinished, now: float) -> TaskFinished:
        """Count ``event`` and return it with the totals filled in."""
        match event.outcome:
            case TaskOutcome.WRITTEN:
                self.done += 1
                self.blocks += event.blocks
                self.rows += event.rows
            case TaskOutcome.RETRYING:
                self.retries += 1
            case TaskOutcome.FAILED:
                self.failed += 1
        elapsed = self.seconds(now)
        blocks_per_s = self.blocks / elapsed
        remaining = self.planned.blocks - self.blocks
        eta = remaining / blocks_per_s if blocks_per_s > 0 else None
        return msgspec.structs.replace(
            event,
            blocks_done=self.blocks,
            rows_done=self.rows,
            tasks_done=self.done,
            tasks_failed=self.failed,
            blocks_per_s=blocks_per_s,
            rows_per_s=self.rows / elapsed,
            eta_s=eta,
        )

    def summary(self, now: float) -> BackfillDone:
        elapsed = self.seconds(now)
        return BackfillDone(
            blocks=self.blocks,
            rows=self.rows,
            tasks=self.done + self.failed,
            failed=self.failed,
            seconds=elapsed,
            skipped=self.planned.skipped_tasks,
            retries=self.retries,
            blocks_per_s=self.blocks / elapsed,
            rows_per_s=self.rows / elapsed,
            unfinished=self.planned.tasks - self.done - self.failed,
        )
