"""Follow: keep a sink table computed for every new block of the block database,
with reorgs reconciled, and the ledger compared with the chain on every start
and after every gap in its watching (see ``blockx_client.follow.follower``).

    stop = asyncio.Event()
    async for event in follow(client, function="volume", source_table="erc20_transfers",
                              sink_table="volume", db_url=BLOCKDB_URL,
                              sink_db_url=SINK_DB_URL, stop=stop):
        print(event)
"""

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
from blockx_client.follow.follower import (
    DEFAULT_FOLLOW_TASKS_IN_FLIGHT,
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REORG_WINDOW,
    REORG_WINDOW_LIMIT,
    RESUME_WINDOW,
    follow,
)
from blockx_client.follow.watch import GapReason
from blockx_client.resubmit import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_LIMIT, OnFailure

__all__ = [
    "DEFAULT_FOLLOW_TASKS_IN_FLIGHT",
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
    "LedgerReconciled",
    "OnFailure",
    "ReorgReconciled",
    "WatchInterrupted",
    "follow",
]
