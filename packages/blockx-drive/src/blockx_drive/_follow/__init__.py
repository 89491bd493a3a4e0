"""Follow: keep a sink table computed for every new block of the block database,
with reorgs reconciled, and the ledger compared with the chain on every start
and after every gap in its watching (see ``blockx_drive._follow.follower``).

    stop = asyncio.Event()
    job = JobSpec(function="volume", source_table="erc20_transfers", sink_table="volume",
                  db_url=BLOCKDB_URL, sink_db_url=SINK_DB_URL)
    async for event in follow(client, job, stop=stop):
        print(event)
"""

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
from blockx_drive._follow.follower import follow
from blockx_drive._follow.watch import GapReason
from blockx_drive.defaults import (
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REORG_WINDOW,
    MAX_ATTEMPTS_LIMIT,
    REORG_WINDOW_LIMIT,
    RESUME_WINDOW,
    OnFailure,
)
from blockx_drive.spec import JobSpec

__all__ = [
    "DEFAULT_FOLLOW_WRITER",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_POLL_INTERVAL_S",
    "DEFAULT_REORG_WINDOW",
    "MAX_ATTEMPTS_LIMIT",
    "REORG_WINDOW_LIMIT",
    "RESUME_WINDOW",
    "BlockFailed",
    "BlockRetrying",
    "BlockWritten",
    "BlocksDeleted",
    "FollowEvent",
    "FollowStarted",
    "GapReason",
    "JobSpec",
    "LedgerReconciled",
    "OnFailure",
    "ReorgReconciled",
    "WatchInterrupted",
    "follow",
]
