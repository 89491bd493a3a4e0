"""Follow: keep a sink table computed for every new block of the block database,
with reorgs reconciled (see ``blockx_client.follow.follower``).

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
    ReorgReconciled,
)
from blockx_client.follow.follower import (
    DEFAULT_FOLLOW_TASKS_IN_FLIGHT,
    DEFAULT_FOLLOW_WRITER,
    DEFAULT_POLL_INTERVAL_S,
    RESUME_WINDOW,
    follow,
)

__all__ = [
    "DEFAULT_FOLLOW_TASKS_IN_FLIGHT",
    "DEFAULT_FOLLOW_WRITER",
    "DEFAULT_POLL_INTERVAL_S",
    "RESUME_WINDOW",
    "BlockFailed",
    "BlockRetrying",
    "BlockWritten",
    "BlocksDeleted",
    "FollowEvent",
    "FollowStarted",
    "ReorgReconciled",
    "follow",
]
