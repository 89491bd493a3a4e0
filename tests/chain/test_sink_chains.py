"""Several chains in one sink table, on both engines: each row and ledger entry
carries its chain id, a chain's write and delete touch its own rows only; a sink
made before rows carried their chain is marked once as the chain named, durably,
and refused until then."""

from __future__ import annotations

import pytest
from sink_layouts import KEY, TABLE, make_sink_at

from blockx_chain.sink import SinkRejected, SinkStore, open_sink
from blockx_chain.sink.schema import index_name
from blockx_chain.url import parse_blockdb_url

MAINNET = 1
BASE = 8453


def _rows(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(r["chain_id"], r["block_number"], r["v"]) for r in rows]


async def _blocks(sink: SinkStore, chain_id: int) -> list[tuple[int, str]]:
    return [(w["block_number"], w["block_hash"]) for w in await sink.written(TABLE, chain_id)]


async def test_two_chains_write_one_table_without_touching_each_others_rows(
    sink: SinkStore,
) -> None:
    await sink.replace_blocks(TABLE, MAINNET, [(n, f"0xa{n}", [{"v": n}]) for n in (1, 2, 3)])
    await sink.replace_blocks(TABLE, BASE, [(n, f"0xb{n}", [{"v": -n}]) for n in (2, 3)])
    # A chain's rewrite of a block leaves the other chain's rows of that number.
    await sink.replace_blocks(TABLE, MAINNET, [(2, "0xa2x", [{"v": 20}, {"v": 21}])])
    # A reorg on base: its block 3 goes, mainnet's block 3 stays.
    assert await sink.delete_blocks(TABLE, BASE, [3]) == 1
    assert _rows(await sink.rows(TABLE)) == [
        (MAINNET, 1, 1),
        (MAINNET, 2, 20),
        (MAINNET, 2, 21),
        (MAINNET, 3, 3),
        (BASE, 2, -2),
    ]
    assert await _blocks(sink, MAINNET) == [(1, "0xa1"), (2, "0xa2x"), (3, "0xa3")]
    assert await _blocks(sink, BASE) == [(2, "0xb2")]
    assert await sink.written_span(TABLE, MAINNET) == (1, 3)
    assert await sink.written_span(TABLE, 10) is None
    # A key is unique per chain: both chains may write the same transaction hash.
    for chain_id in (MAINNET, BASE):
        await sink.replace_blocks("txs", chain_id, [(5, "0x5", [{"tx": "0xaa"}])], key=["tx"])
    assert sorted(r["chain_id"] for r in await sink.rows("txs")) == [MAINNET, BASE]
    # A row may say its own chain, never another's.
    await sink.replace_blocks(TABLE, BASE, [(4, "0xb4", [{"v": 4, "chain_id": BASE}])])
    with pytest.raises(SinkRejected, match=f"carries chain_id {MAINNET}"):
        await sink.replace_blocks(TABLE, BASE, [(4, "0xb4", [{"v": 4, "chain_id": MAINNET}])])
    for bad in (-1, True, "1", 2**63):
        with pytest.raises(SinkRejected, match="is no chain id"):
            await sink.written(TABLE, bad)  # type: ignore[arg-type]


async def test_a_sink_of_the_previous_layout_is_marked_once_as_the_chain_named(
    db_url: str,
) -> None:
    await make_sink_at(db_url, 1, [(1, "0x1", [10, 11]), (2, "0x2", [20])])
    url = parse_blockdb_url(db_url)
    first, second = await open_sink(url), await open_sink(url)
    try:
        assert await first.unmarked()
        # Until told whose rows they are, the ledger is neither read nor written.
        with pytest.raises(SinkRejected, match="before sink rows carried their chain"):
            await first.written(TABLE, MAINNET)
        with pytest.raises(SinkRejected, match="before sink rows carried their chain"):
            await first.replace_blocks(TABLE, MAINNET, [(3, "0x3", [{"v": 30}])])
        with pytest.raises(SinkRejected, match="before sink rows carried their chain"):
            await first.delete_blocks(TABLE, MAINNET, [1])
        sample = await first.unmarked_blocks(1)
        assert sorted((r["block_number"], r["block_hash"]) for r in sample) == [
            (1, "0x1"),
            (2, "0x2"),
        ]
        assert await second.unmarked()
        assert await first.mark_chain(MAINNET)
        # Marked already: the other store learns it from the sink, and marks nothing.
        assert not await second.mark_chain(BASE)
        assert await second.unmarked_blocks(1) == []
        assert await second.written(TABLE, BASE) == []
    finally:
        await first.close()
        await second.close()
    sink = await open_sink(url)
    try:
        assert not await sink.unmarked()
        assert _rows(await sink.rows(TABLE)) == [
            (MAINNET, 1, 10),
            (MAINNET, 1, 11),
            (MAINNET, 2, 20),
        ]
        assert await _blocks(sink, MAINNET) == [(1, "0x1"), (2, "0x2")]
        # The unique index is led by the chain id now: base writes block 1 beside it.
        async with sink.transaction() as tx:
            names = {i.name for i in await tx.table_indexes(TABLE)}
        assert names == {index_name("ux", TABLE, ["chain_id", *KEY])}
        await sink.replace_blocks(TABLE, BASE, [(1, "0xb1", [{"v": 99}])])
        await sink.replace_blocks(TABLE, MAINNET, [(2, "0x2", [{"v": 22}])])
        assert _rows(await sink.rows(TABLE)) == [
            (MAINNET, 1, 10),
            (MAINNET, 1, 11),
            (MAINNET, 2, 22),
            (BASE, 1, 99),
        ]
        twice = [{"v": 1, "row_index": 0}, {"v": 2, "row_index": 0}]
        with pytest.raises(SinkRejected, match="do not fit"):
            await sink.replace_blocks(TABLE, BASE, [(5, "0x5", twice)], key=KEY)
    finally:
        await sink.close()


async def test_a_write_claiming_older_rows_marks_them_as_its_chain(db_url: str) -> None:
    await make_sink_at(db_url, 1, [(1, "0x1", [10])])
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        written = await sink.replace_blocks(
            TABLE, BASE, [(2, "0x2", [{"v": 20}])], claim_unmarked=True
        )
        assert written == {"blocks": 1, "rows": 1}
        assert _rows(await sink.rows(TABLE)) == [(BASE, 1, 10), (BASE, 2, 20)]
        assert await _blocks(sink, BASE) == [(1, "0x1"), (2, "0x2")]
        assert not await sink.unmarked()
    finally:
        await sink.close()


async def test_a_sink_of_the_previous_layout_without_rows_needs_no_chain(db_url: str) -> None:
    await make_sink_at(db_url, 1, [])
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        assert not await sink.unmarked()
        assert await sink.written(TABLE, BASE) == []
        await sink.replace_blocks(TABLE, BASE, [(1, "0x1", [{"v": 1}])])
        assert _rows(await sink.rows(TABLE)) == [(BASE, 1, 1)]
    finally:
        await sink.close()


async def test_a_stamped_table_dropped_by_hand_does_not_stop_the_marking(db_url: str) -> None:
    await make_sink_at(db_url, 1, [(1, "0x1", [10])])
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        async with sink.transaction() as tx:
            await tx.execute(f'DROP TABLE "{TABLE}"')  # behind the writers' back
        assert await sink.mark_chain(BASE)
        assert await _blocks(sink, BASE) == [(1, "0x1")]
    finally:
        await sink.close()
