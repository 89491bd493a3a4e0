"""The sink's ledger reads and repair on both engines: the ledger over a range, its
span, and deleting blocks (rows and ledger entries in one transaction)."""

from __future__ import annotations

import pytest

from blockx_chain.sink import SinkRejected, SinkStore


async def test_deleting_blocks_removes_their_rows_and_ledger_entries(sink: SinkStore) -> None:
    assert await sink.written_span("volume", 1) is None
    blocks = [(n, f"0x{n:02x}", [{"n": n}, {"n": n + 100}]) for n in range(1, 6)]
    await sink.replace_blocks("volume", 1, blocks)
    await sink.replace_blocks("other", 1, [(4, "0x04", [{"n": 4}])])
    assert await sink.written_span("volume", 1) == (1, 5)
    assert [w["block_number"] for w in await sink.written("volume", 1, 2, 4)] == [2, 3, 4]
    assert [w["block_number"] for w in await sink.written("volume", 1, 4)] == [4, 5]

    assert await sink.delete_blocks("volume", 1, [5, 4, 9]) == 2
    assert sorted({r["block_number"] for r in await sink.rows("volume")}) == [1, 2, 3]
    assert [w["block_number"] for w in await sink.written("volume", 1)] == [1, 2, 3]
    assert await sink.written_span("volume", 1) == (1, 3)
    # Another table's block of the same number stays.
    assert [w["block_number"] for w in await sink.written("other", 1)] == [4]
    assert await sink.delete_blocks("volume", 1, []) == 0


async def test_deleting_from_a_table_never_written_or_a_chain_table(sink: SinkStore) -> None:
    assert await sink.delete_blocks("never", 1, [1]) == 0
    with pytest.raises(SinkRejected):
        await sink.delete_blocks("blocks", 1, [1])
