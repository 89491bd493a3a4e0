"""The drivers' defaults and bounds, which ``blockx backfill --help`` and ``blockx
follow --help`` show: a module that loads neither the cluster's client nor the
databases' drivers (the modules that use these names import them from here)."""

from __future__ import annotations

import enum
from typing import Final

from blockx_chain.ingest.plan import DEFAULT_MAX_REORG_DEPTH

# ---- attempts -------------------------------------------------------------------------
DEFAULT_MAX_ATTEMPTS: Final = 8
# Past this many attempts (about 8 minutes of back-off) an outage is no longer
# "for a while": a bound, so that no block is retried for ever.
MAX_ATTEMPTS_LIMIT: Final = 100


class OnFailure(enum.StrEnum):
    """What a driver does once a block (a task) has failed for good."""

    CONTINUE = "continue"  # report it and go on with the other blocks
    STOP = "stop"  # report it and end the run: no block is started after it


# ---- backfill -------------------------------------------------------------------------
DEFAULT_BLOCKS_PER_TASK: Final = 1000
DEFAULT_BACKFILL_WRITER = "BlockBundleWriteResultHandler"
DEFAULT_TASKS_IN_FLIGHT: Final = 4
# Without --bundle-size a task's blocks are one bundle (one sink transaction), up
# to this many blocks: every transaction pays its canonical check, the sink's
# write lock and a commit, and ten of them a task (the Workers' default bundle of
# 100 blocks) cost backfill about a fifth of its time. A smaller --bundle-size
# commits sooner and holds fewer rows.
DEFAULT_BUNDLE_SIZE_LIMIT: Final = 10_000


def default_bundle_size(blocks_per_task: int) -> int:
    """The bundle (blocks per writer transaction) of a backfill given no --bundle-size."""
    return min(blocks_per_task, DEFAULT_BUNDLE_SIZE_LIMIT)


# ---- follow ---------------------------------------------------------------------------
RESUME_WINDOW: Final = 1000
# Reconciled below follow's head: as deep as ingest applies a reorg by default.
DEFAULT_REORG_WINDOW: Final = DEFAULT_MAX_REORG_DEPTH
REORG_WINDOW_LIMIT: Final = 100_000
# A head query costs well under a millisecond; this wait is most of a block's lag.
DEFAULT_POLL_INTERVAL_S: Final = 0.1
DEFAULT_FOLLOW_WRITER: Final = "BlockWriteResultHandler"
