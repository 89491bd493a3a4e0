"""The decisions of ingest, as pure functions: no node, no database, no clock.

* ``start_block``: where a run begins (the database's head + 1, 0 when empty, or
  ``--from``; a ``--from`` that would leave a gap is refused).
* ``next_batch``: the next range of blocks to fetch.
* ``finalized_number``: min(head - confirmations, the node's finalized block).
* ``check_batch``: compares a fetched batch with the stored blocks around it and
  says whether it extends the database, or where the stored branch left the node's.
* ``check_headers``: the same for a selective run's headers, which skip blocks.
* ``check_filter``: whether a run may write a database, given the log filter it
  was made with and the run's.
* ``fork_point``: the walk back to the last block both branches share.
* ``plan_reorg``: whether a reorg may be applied (depth limit, finality) and how.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from blockx_chain.ingest.errors import (
    DeepReorgRefused,
    FilterRefused,
    GapRefused,
    IngestError,
    ReorgTooDeep,
)
from blockx_chain.schema import LogFilterRecord

DEFAULT_CONFIRMATIONS = 12
DEFAULT_MAX_REORG_DEPTH = 64
DEFAULT_BATCH_SIZE = 50
# A batch is one JSON-RPC batch of two requests a block and one transaction: past a
# thousand blocks its answer outgrows RPC_MAX_RESPONSE_BYTES (32 MiB) on busy
# blocks, and the batch is then asked again in halves.
MAX_BATCH_SIZE = 1000
# An eth_blockNumber every quarter second: cheap for a node, and most of a new
# block's way to the sink is this wait.
DEFAULT_POLL_INTERVAL_S = 0.25


def start_block(head_number: int | None, requested: int | None) -> int:
    """The first block of a run; ``head_number`` is the stored head (None on an
    empty database)."""
    if requested is not None and requested < 0:
        raise IngestError(f"--from must be 0 or more, got {requested}")
    if head_number is None:
        return 0 if requested is None else requested
    if requested is None:
        return head_number + 1
    if requested > head_number + 1:
        raise GapRefused(
            f"--from {requested} would leave a gap: the block database ends at block "
            f"{head_number}, so a run may start at {head_number + 1} at the latest"
        )
    return requested


def next_batch(next_number: int, target: int, batch_size: int) -> range | None:
    """Blocks ``next_number`` .. at most ``target``, at most ``batch_size`` of them."""
    if next_number > target:
        return None
    return range(next_number, min(next_number + batch_size, target + 1))


def finalized_number(
    head_number: int | None,
    confirmations: int,
    node_finalized: int | None,
    previous: int | None,
) -> int | None:
    """The database's finalized height: min(head - confirmations, the node's
    finalized block when it reports one), never below what it already was (blocks
    once final stay final: a reorg under them is refused), never above the head."""
    if head_number is None:
        return previous
    candidate = head_number - confirmations
    if node_finalized is not None:
        candidate = min(candidate, node_finalized)
    if previous is not None:
        candidate = max(candidate, min(previous, head_number))
    return candidate if candidate >= 0 else None


class Extends(msgspec.Struct, frozen=True):
    """The batch joins the stored chain (or re-writes blocks the database already
    holds with the same hashes)."""


class Diverges(msgspec.Struct, frozen=True):
    """The stored chain left the node's branch: ``fork`` is the last block both share
    (when known from the batch itself) or None (walk back below the batch)."""

    fork: int | None


BatchCheck = Extends | Diverges


class StoredBlock(msgspec.Struct, frozen=True):
    hash: str
    parent_hash: str


def check_batch(
    numbers: Sequence[int],
    hashes: Sequence[str],
    parents: Sequence[str],
    stored: Mapping[int, StoredBlock],
) -> BatchCheck:
    """Compare fetched blocks (consecutive ``numbers``, their ``hashes`` and
    ``parents``; the fetch checked they form a chain) with the stored blocks from
    one below the batch to one above it."""
    below = stored.get(numbers[0] - 1)
    if below is not None and below.hash != parents[0]:
        return Diverges(fork=None)
    for number, block_hash in zip(numbers, hashes, strict=True):
        held = stored.get(number)
        if held is not None and held.hash != block_hash:
            # Its parent is shared (checked above, or the previous block matched),
            # when the database holds it.
            return Diverges(fork=number - 1 if number - 1 in stored else None)
    # Continuity with the stored block after the range: it must sit on the batch's
    # last block. (When the last block matched, it does; this catches a run that
    # joins a database from below.)
    above = stored.get(numbers[-1] + 1)
    if above is not None and above.parent_hash != hashes[-1]:
        return Diverges(fork=None)
    return Extends()


def check_headers(
    numbers: Sequence[int],
    hashes: Sequence[str],
    parents: Sequence[str],
    stored: Mapping[int, StoredBlock],
) -> BatchCheck:
    """Compare a selective run's headers (ascending ``numbers``, not consecutive:
    the fetch checked the consecutive ones chain) with the stored blocks: a stored
    block of another hash at a fetched number, or a link to a stored neighbour that
    does not hold, is a reorg, found by a walk back below the range."""
    for number, block_hash, parent in zip(numbers, hashes, parents, strict=True):
        held = stored.get(number)
        below = stored.get(number - 1)
        above = stored.get(number + 1)
        if (
            (held is not None and held.hash != block_hash)
            or (below is not None and below.hash != parent)
            or (above is not None and above.parent_hash != block_hash)
        ):
            return Diverges(fork=None)
    return Extends()


def check_filter(stored: LogFilterRecord | None, wanted: LogFilterRecord | None) -> None:
    """FilterRefused when a run would mix kinds of data in one database: whole blocks
    into a selective one, a selective run into one of whole blocks, or another filter
    than the database's (``stored``: its filter, None for whole blocks; ``wanted``:
    the run's, None for a full run)."""
    if stored is None and wanted is not None:
        raise FilterRefused(
            "the block database holds whole blocks (made by a full ingest): a selective "
            "ingest (--logs) would leave blocks without their transactions; give it a "
            "database of its own"
        )
    if stored is not None and wanted is None:
        raise FilterRefused(
            f"the block database holds only {stored.describe()} (made by "
            "`blockx chain ingest --logs`): a full ingest would leave its earlier blocks "
            "without transactions; ingest whole blocks into another database"
        )
    if stored is not None and wanted is not None and not stored.same_filter(wanted):
        raise FilterRefused(
            f"the block database holds {stored.describe()}, not {wanted.describe()}: a "
            "database keeps the filter it was made with; ingest this one into another "
            "database"
        )


def fork_point(stored: Mapping[int, str], node: Mapping[int, str], top: int) -> int | None:
    """The highest block at or below ``top`` whose stored hash is the node's: the last
    common block. ``stored`` and ``node`` hold the hashes of the window walked; None
    when no block of the window is shared."""
    for number in range(top, min(stored, default=top + 1) - 1, -1):
        held = stored.get(number)
        if held is not None and node.get(number) == held:
            return number
    return None


def walk_window(top: int, head_number: int, max_depth: int) -> range:
    """The blocks a fork walk reads: from ``top`` down to ``head - max_depth`` (a
    fork lower than that abandons more than ``max_depth`` blocks)."""
    return range(max(head_number - max_depth, 0), top + 1)


class ReorgPlan(msgspec.Struct, frozen=True, kw_only=True):
    fork_block_number: int  # the last block both branches share
    depth: int  # stored blocks abandoned
    new_epoch: bool  # a reorg below the finalized height, allowed: cached reads drop


def plan_reorg(
    fork: int | None,
    head_number: int,
    finalized: int | None,
    max_depth: int,
    allow_deep_reorg: bool,
) -> ReorgPlan:
    """What to do about a stored branch the node no longer has, or why not."""
    if fork is None or head_number - fork > max_depth:
        abandoned = f"more than {max_depth}" if fork is None else str(head_number - fork)
        raise ReorgTooDeep(
            f"a reorg below the stored head {head_number} would abandon {abandoned} blocks, "
            f"more than --max-reorg-depth {max_depth}: nothing was changed; raise "
            "--max-reorg-depth or re-ingest into a fresh database"
        )
    below_final = finalized is not None and fork < finalized
    if below_final and not allow_deep_reorg:
        raise DeepReorgRefused(
            f"a reorg forks at block {fork}, below the finalized block {finalized}: "
            "refused (pass --allow-deep-reorg to apply it and start a new epoch)"
        )
    return ReorgPlan(fork_block_number=fork, depth=head_number - fork, new_epoch=below_final)
