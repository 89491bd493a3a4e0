"""The sink's ``_blockx_written`` ledger against the canonical chain.

A block writer records, per sink table and block, the hash of the block it wrote.
Backfill skips a block whose recorded hash is still the canonical one; follow
rewrites a block whose recorded hash is no longer canonical and deletes one that
is no longer in the chain at all (above the head of a shorter new branch).
``reconcile`` is that decision and ``reach`` the window it covers after follow
starts or misses some of the chain, pure functions; the reads sit beside them.

The ledger is kept per chain: a driver reads the entries of the chain of the
block database it plans from (``planning_chain``), never another chain's. A sink
written before rows carried their chain is marked as this chain's when its
ledger's hashes are this chain's blocks (``claim_older_rows``): two chains never
share a block hash, so a match is knowledge, not a guess.

A sink table may be an Iceberg table of the lake whose SQL catalog is the sink
database (``blockx_chain.lake``): its ledger is the same, its rows are deleted
through the lake (``delete_written``), and a driver brings its ledger up to the
table's snapshots before planning (``catch_up_lake``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, NoReturn

import msgspec

from blockx_chain.lake import lake_of
from blockx_chain.sink import SinkRejected, SinkStore
from blockx_chain.store import BlockStore, StoreError
from blockx_chain.url import BlockDbUrl

# Ledger entries of an unmarked sink compared with the chain: its lowest and highest.
OLDER_ROWS_SAMPLE: Final = 16


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """What to do so the ledger matches the chain: ``rewrite`` blocks (number →
    canonical hash) written on another branch, ``delete`` blocks no longer in it."""

    rewrite: dict[int, str] = msgspec.field(default_factory=dict)
    delete: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.rewrite and not self.delete


def reconcile(written: Mapping[int, str], canonical: Mapping[int, str]) -> Reconciliation:
    """Compare ``written`` (number → hash, from the ledger) with ``canonical``
    (number → hash of every stored block over the same numbers)."""
    rewrite = {}
    delete = []
    for number in sorted(written):
        current = canonical.get(number)
        if current is None:
            delete.append(number)
        elif current != written[number]:
            rewrite[number] = current
    return Reconciliation(rewrite=rewrite, delete=tuple(delete))


def reach(*, top: int, head: int, finalized: int | None, reorg_window: int) -> int:
    """The lowest block a reorg can still change, for a ledger whose highest block is
    ``top`` over a block database at ``head`` with ``finalized`` as its finalized
    height (None: nothing final yet): every block above the finalized height, and at
    least the ``reorg_window`` blocks up to the lower of the two heads (a ledger
    above the database's head is a branch the chain left)."""
    if reorg_window < 1:
        raise ValueError(f"reorg_window must be >= 1, got {reorg_window}")
    lowest = min(top, head) - reorg_window + 1
    lowest = min(lowest, 0 if finalized is None else finalized + 1)
    return max(lowest, 0)


def up_to_date(numbers: range, written: Mapping[int, str], canonical: Mapping[int, str]) -> bool:
    """Every block of ``numbers`` is written with its canonical hash."""
    return all(n in canonical and written.get(n) == canonical[n] for n in numbers)


async def canonical_blocks(
    store: BlockStore, from_block: int, to_block: int
) -> dict[int, dict[str, Any]]:
    """The stored blocks in ``[from_block, to_block]`` by number (read in pages the
    store's row limit allows)."""
    return await _by_number(store.blocks, store.max_rows, from_block, to_block)


async def canonical_hashes(store: BlockStore, from_block: int, to_block: int) -> dict[int, str]:
    """The hash of each stored block in ``[from_block, to_block]`` by number (read
    in pages, the hashes alone)."""
    rows = await _by_number(store.hashes, store.max_rows, from_block, to_block)
    return {n: row["block_hash"] for n, row in rows.items()}


async def _by_number(
    read: Callable[[int, int], Awaitable[list[dict[str, Any]]]],
    max_rows: int,
    from_block: int,
    to_block: int,
) -> dict[int, dict[str, Any]]:
    """The rows ``read`` answers for ``[from_block, to_block]``, one block each, by
    number, read ``max_rows`` blocks at a time."""
    found: dict[int, dict[str, Any]] = {}
    start = from_block
    while start <= to_block:
        end = min(to_block, start + max_rows - 1)
        for row in await read(start, end):
            found[row["block_number"]] = row
        start = end + 1
    return found


async def written_hashes(
    sink: SinkStore,
    table: str,
    chain_id: int,
    from_block: int | None = None,
    to_block: int | None = None,
) -> dict[int, str]:
    """The ledger of ``table`` for the chain ``chain_id``: block number → the hash
    written."""
    rows = await sink.written(table, chain_id, from_block, to_block)
    return {r["block_number"]: r["block_hash"] for r in rows}


async def planning_chain(store: BlockStore, sink: SinkStore) -> int:
    """The chain id of the block database a driver plans from, the sink's older
    rows marked as that chain's when they are (``claim_older_rows``). StoreError
    while the block database holds no chain yet."""
    state = await store.chain()
    if state is None:
        raise StoreError(
            "the block database holds no chain yet: ingest it first (blockx chain ingest)"
        )
    await claim_older_rows(sink, store, state.chain_id)
    return state.chain_id


async def claim_older_rows(sink: SinkStore, store: BlockStore, chain_id: int) -> bool:
    """Mark the rows the sink holds from before rows carried their chain as the chain
    ``chain_id``'s when a ledger entry among its lowest and highest has the hash the
    block database holds for that block. Returns whether it marked them; False when
    the sink holds no such rows. SinkRejected when the block database holds those
    blocks under other hashes (another chain's rows), or none of them."""
    sample = await sink.unmarked_blocks(OLDER_ROWS_SAMPLE)
    if not sample:
        if await sink.unmarked():
            _unknowable(sink, [])
        return False
    canonical: dict[int, str] = {}
    for number in sorted({row["block_number"] for row in sample}):
        canonical.update(await canonical_hashes(store, number, number))
    if any(canonical.get(row["block_number"]) == row["block_hash"] for row in sample):
        return await sink.mark_chain(chain_id)
    held = [row for row in sample if row["block_number"] in canonical]
    if held:
        first = held[0]
        raise SinkRejected(
            f"{sink.description} holds rows written before sink rows carried their chain, "
            f"and they are not chain {chain_id}'s (the block database's): block "
            f"{first['block_number']} of table {first['table_name']!r} has hash "
            f"{first['block_hash']} there, {canonical[first['block_number']]} here; run "
            "against the block database of the chain they were written from first"
        )
    return _unknowable(sink, [row["block_number"] for row in sample])


def _unknowable(sink: SinkStore, numbers: list[int]) -> NoReturn:
    held = f" (blocks {min(numbers)}..{max(numbers)})" if numbers else ""
    raise SinkRejected(
        f"{sink.description} holds rows written before sink rows carried their chain, and "
        f"the block database holds none of their blocks{held} to tell which chain they "
        "are from: ingest some of those blocks, or run against the block database of "
        "the chain they were written from"
    )


async def catch_up_lake(url: BlockDbUrl, table: str) -> None:
    """When ``table`` is an Iceberg table of the lake whose catalog is the sink
    database ``url``: its ledger brought up to the table's snapshots (a Worker may
    have stopped between a commit and its ledger). A table of a catalog elsewhere
    is left to its Workers, which do the same as they write."""
    try:
        lake = await lake_of(url, table)
    except SinkRejected:
        return  # a catalog elsewhere: its Workers bring its ledger up to date
    if lake is not None:
        await lake.close()


async def delete_written(
    sink: SinkStore, url: BlockDbUrl, table: str, chain_id: int, numbers: tuple[int, ...]
) -> int:
    """The rows and ledger entries of these blocks of ``table`` removed: through the
    lake for one of its Iceberg tables, else in the sink database; SinkRejected
    for an Iceberg table of a catalog the sink database does not hold."""
    lake = await lake_of(url, table)
    if lake is None:
        return await sink.delete_blocks(table, chain_id, numbers)
    try:
        return await lake.delete_blocks(table, chain_id, numbers)
    finally:
        await lake.close()
