"""Backfill: a block range through the bundle cluster into a sink table, resumable.

    job = JobSpec(function="volume", source_table="erc20_transfers", sink_table="volume",
                  db_url=BLOCKDB_URL, sink_db_url=SINK_DB_URL)
    async for event in backfill(client, job, from_block=0, to_block=9_999):
        print(event)

``plan`` cuts the range and skips what the sink's ledger already holds for the
current block hashes; ``driver`` runs the tasks with bounded concurrency and
resubmits with lineage; ``progress`` holds the events.
"""

from blockx_drive._backfill.driver import backfill
from blockx_drive._backfill.plan import (
    BackfillError,
    BackfillPlan,
    TaskRange,
    plan,
    split,
)
from blockx_drive._backfill.progress import (
    BackfillDone,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
)
from blockx_drive.defaults import (
    DEFAULT_BACKFILL_WRITER,
    DEFAULT_BLOCKS_PER_TASK,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TASKS_IN_FLIGHT,
    MAX_ATTEMPTS_LIMIT,
    OnFailure,
)
from blockx_drive.spec import JobSpec

__all__ = [
    "DEFAULT_BACKFILL_WRITER",
    "DEFAULT_BLOCKS_PER_TASK",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_TASKS_IN_FLIGHT",
    "MAX_ATTEMPTS_LIMIT",
    "BackfillDone",
    "BackfillError",
    "BackfillEvent",
    "BackfillPlan",
    "BackfillPlanned",
    "JobSpec",
    "OnFailure",
    "TaskFinished",
    "TaskOutcome",
    "TaskRange",
    "backfill",
    "plan",
    "split",
]
