"""What ``follow`` reports: tagged msgspec Structs; encoded as JSON each is one
object whose ``event`` field names it."""

from __future__ import annotations

import msgspec

from blockx_drive._follow.watch import GapReason
from blockx_drive.jobs import LagFrom


class FollowStarted(msgspec.Struct, frozen=True, kw_only=True, tag="start", tag_field="event"):
    job_id: str  # the run's job record in the sink; its tasks' ids start with it
    from_block: int  # the first block follow looks at
    head: int | None  # the block database's head then (None: nothing ingested yet)
    reorg_cursor: int  # reorgs with a higher id are handled as they appear
    # Why the function was not checked before any task went out ("" when it was).
    function_unchecked: str = ""


class BlockWritten(msgspec.Struct, frozen=True, kw_only=True, tag="block", tag_field="event"):
    number: int
    hash: str
    rows: int
    task_id: str
    attempt: int
    # Now minus when ingest stored the block (the block database's seen_at_ms), or,
    # for a block stored before the database recorded that, when follow first saw
    # it: ``lag_from`` says which. Not the block's own timestamp, which a devnet
    # (or a clock apart) makes meaningless.
    lag_ms: int
    lag_from: LagFrom
    # Now minus when follow first saw the block in the block database.
    seen_lag_ms: int


class BlockFailed(msgspec.Struct, frozen=True, kw_only=True, tag="failed", tag_field="event"):
    """A block whose task failed for good (not retryable, or out of ``max_attempts``)
    while its hash was still canonical: follow goes on without it, or stops, as
    ``on_failure`` says."""

    number: int
    hash: str
    task_id: str
    attempt: int
    failure_code: str
    failure_message: str


class BlockRetrying(msgspec.Struct, frozen=True, kw_only=True, tag="retry", tag_field="event"):
    """An attempt that failed retryably (or whose Worker was lost): the block runs
    again under a new task_id of its lineage."""

    number: int
    hash: str
    task_id: str
    attempt: int
    failure_code: str
    failure_message: str


class ReorgReconciled(msgspec.Struct, frozen=True, kw_only=True, tag="reorg", tag_field="event"):
    """A reorg recorded in the block database's ``reorgs``, and what follow did about
    the sink: blocks written on the abandoned branch that it runs again on the new
    one (``rewritten``), and blocks above the new head whose rows and ledger entries
    it deleted (``deleted``)."""

    reorg_id: int
    fork_block_number: int  # the last block both branches share
    depth: int
    rewritten: tuple[int, ...]
    deleted: tuple[int, ...]


class BlocksDeleted(msgspec.Struct, frozen=True, kw_only=True, tag="deleted", tag_field="event"):
    """Blocks whose rows follow deleted outside a reorg event: written (or being
    written) when the chain no longer held them."""

    numbers: tuple[int, ...]


class LedgerReconciled(
    msgspec.Struct, frozen=True, kw_only=True, tag="reconcile", tag_field="event"
):
    """The ledger compared with the canonical chain over the window a reorg can
    reach, on every start and after every gap in follow's watching (``reason``):
    blocks written under another hash run again (``rewritten``), blocks the chain
    no longer holds lose their rows and ledger entries (``deleted``)."""

    reason: GapReason
    from_block: int | None  # the ledger blocks compared (None: none to compare)
    to_block: int | None
    checked: int  # ledger entries compared
    rewritten: tuple[int, ...]
    deleted: tuple[int, ...]


class WatchInterrupted(
    msgspec.Struct, frozen=True, kw_only=True, tag="interrupted", tag_field="event"
):
    """The block database or the sink could not be read: follow looks again after
    ``retry_in_s``, and reconciles its ledger once it can."""

    message: str
    retry_in_s: float


FollowEvent = (
    FollowStarted
    | BlockWritten
    | BlockRetrying
    | BlockFailed
    | ReorgReconciled
    | BlocksDeleted
    | LedgerReconciled
    | WatchInterrupted
)
