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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockx_drive._backfill import (
        BackfillDone,
        BackfillError,
        BackfillEvent,
        BackfillPlanned,
        TaskFinished,
        TaskOutcome,
        backfill,
    )
    from blockx_drive._follow import (
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
        ClusterUnreachable,
    )
    from blockx_drive.defaults import (
        DEFAULT_BACKFILL_WRITER,
        DEFAULT_BLOCKS_PER_TASK,
        DEFAULT_FOLLOW_WRITER,
        DEFAULT_MAX_ATTEMPTS,
        DEFAULT_POLL_INTERVAL_S,
        DEFAULT_REORG_WINDOW,
        DEFAULT_TASKS_IN_FLIGHT,
        MAX_ATTEMPTS_LIMIT,
        REORG_WINDOW_LIMIT,
        RESUME_WINDOW,
        OnFailure,
    )
    from blockx_drive.jobs import (
        JobKind,
        JobProgress,
        JobState,
        LagFrom,
        list_jobs,
    )
    from blockx_drive.spec import (
        JobSpec,
    )
    from blockx_drive.submission import (
        SubmissionRefused,
    )

# The names load on first use: ``blockx backfill --help`` reads the defaults
# (``blockx_drive.defaults``) without loading the drivers, the cluster's client and
# the databases' drivers.
_MODULES: dict[str, str] = {
    "BackfillDone": "blockx_drive._backfill",
    "BackfillError": "blockx_drive._backfill",
    "BackfillEvent": "blockx_drive._backfill",
    "BackfillPlanned": "blockx_drive._backfill",
    "BlockFailed": "blockx_drive._follow",
    "BlockRetrying": "blockx_drive._follow",
    "BlockWritten": "blockx_drive._follow",
    "BlocksDeleted": "blockx_drive._follow",
    "ClusterUnreachable": "blockx_drive.attempts",
    "DEFAULT_BACKFILL_WRITER": "blockx_drive.defaults",
    "DEFAULT_BLOCKS_PER_TASK": "blockx_drive.defaults",
    "DEFAULT_FOLLOW_WRITER": "blockx_drive.defaults",
    "DEFAULT_MAX_ATTEMPTS": "blockx_drive.defaults",
    "DEFAULT_POLL_INTERVAL_S": "blockx_drive.defaults",
    "DEFAULT_REORG_WINDOW": "blockx_drive.defaults",
    "DEFAULT_TASKS_IN_FLIGHT": "blockx_drive.defaults",
    "FollowEvent": "blockx_drive._follow",
    "FollowStarted": "blockx_drive._follow",
    "GapReason": "blockx_drive._follow",
    "JobKind": "blockx_drive.jobs",
    "JobProgress": "blockx_drive.jobs",
    "JobSpec": "blockx_drive.spec",
    "JobState": "blockx_drive.jobs",
    "LagFrom": "blockx_drive.jobs",
    "LedgerReconciled": "blockx_drive._follow",
    "MAX_ATTEMPTS_LIMIT": "blockx_drive.defaults",
    "OnFailure": "blockx_drive.defaults",
    "REORG_WINDOW_LIMIT": "blockx_drive.defaults",
    "RESUME_WINDOW": "blockx_drive.defaults",
    "ReorgReconciled": "blockx_drive._follow",
    "SubmissionRefused": "blockx_drive.submission",
    "TaskFinished": "blockx_drive._backfill",
    "TaskOutcome": "blockx_drive._backfill",
    "WatchInterrupted": "blockx_drive._follow",
    "backfill": "blockx_drive._backfill",
    "follow": "blockx_drive._follow",
    "list_jobs": "blockx_drive.jobs",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import version

        return version("blockx-drive")
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
