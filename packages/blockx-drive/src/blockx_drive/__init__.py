"""blockx_drive: the drivers that run block ranges through the clusters into a sink table.

    from blockx_client import Client
    from blockx_drive import JobSpec, backfill, follow

    job = JobSpec(function="volume", source_table="erc20_transfers", sink_table="volume",
                  db_url=BLOCKDB_URL, sink_db_url=SINK_DB_URL)
    async with Client() as client:
        async for event in backfill(client, job, from_block=0, to_block=9_999):
            print(event)
        async for event in follow(client, job, stop=stop):
            print(event)

``backfill`` (``blockx_drive._backfill``) runs a block range, resumable: the sink's
ledger (``ledger``) says what is written already. ``follow``
(``blockx_drive._follow``) keeps the table computed for every new block, reorgs
reconciled. Both run their tasks' attempts on the client's attempt book and pump
(``blockx_client.attempts``), check what they can before any task goes out
(``submission``) and keep a job record in the sink (``jobs``: ``list_jobs``
reads them, ``job_progress`` folds the drivers' events into them).

The SDK (``blockx_client``) does not depend on this package: the drivers read
the block database and the sink (``blockx_chain``), the SDK only talks to the
clusters.
"""

from importlib.metadata import version

from blockx_drive._backfill import (
    DEFAULT_BACKFILL_WRITER,
    DEFAULT_BLOCKS_PER_TASK,
    BackfillDone,
    BackfillError,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
    backfill,
)
from blockx_drive._follow import (
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REORG_WINDOW,
    REORG_WINDOW_LIMIT,
    RESUME_WINDOW,
    BlockFailed,
    BlockRetrying,
    BlocksDeleted,
    BlockWritten,
    FollowEvent,
    FollowStarted,
    GapReason,
    LedgerReconciled,
    ReorgReconciled,
    WatchInterrupted,
    follow,
)
from blockx_drive.attempts import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    ClusterUnreachable,
    OnFailure,
)
from blockx_drive.jobs import JobKind, JobProgress, JobState, LagFrom, list_jobs
from blockx_drive.spec import DEFAULT_TASKS_IN_FLIGHT, JobSpec
from blockx_drive.submission import SubmissionRefused

__version__ = version("blockx-drive")

__all__ = [
    "DEFAULT_BACKFILL_WRITER",
    "DEFAULT_BLOCKS_PER_TASK",
    "DEFAULT_FOLLOW_WRITER",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_POLL_INTERVAL_S",
    "DEFAULT_REORG_WINDOW",
    "DEFAULT_TASKS_IN_FLIGHT",
    "MAX_ATTEMPTS_LIMIT",
    "REORG_WINDOW_LIMIT",
    "RESUME_WINDOW",
    "BackfillDone",
    "BackfillError",
    "BackfillEvent",
    "BackfillPlanned",
    "BlockFailed",
    "BlockRetrying",
    "BlockWritten",
    "BlocksDeleted",
    "ClusterUnreachable",
    "FollowEvent",
    "FollowStarted",
    "GapReason",
    "JobKind",
    "JobProgress",
    "JobSpec",
    "JobState",
    "LagFrom",
    "LedgerReconciled",
    "OnFailure",
    "ReorgReconciled",
    "SubmissionRefused",
    "TaskFinished",
    "TaskOutcome",
    "WatchInterrupted",
    "__version__",
    "backfill",
    "follow",
    "list_jobs",
]
