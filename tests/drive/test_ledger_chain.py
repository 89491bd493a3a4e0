"""A driver's chain: the chain id of the block database it plans from, and the
rows of a sink made before rows carried their chain marked as that chain's only
when the ledger's hashes are its blocks' (a real block database and sinks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chain_rows import CHAIN_ID, block_hash, seed_chain
from sink_layouts import TABLE, make_sink_at

from blockx_chain.sink import SinkRejected, open_sink
from blockx_chain.store import StoreError, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_drive.ledger import planning_chain


async def test_an_older_sink_is_marked_as_the_planning_chain_only_by_its_hashes(
    tmp_path: Path,
) -> None:
    chain_url = f"sqlite:///{tmp_path}/chain.db"
    await seed_chain(chain_url, 6)
    # Ours: block 1 as the chain holds it, block 2 on a branch the chain left.
    ours = f"sqlite:///{tmp_path}/ours.db"
    await make_sink_at(ours, 1, [(1, block_hash(1), [1]), (2, block_hash(2, branch=1), [2])])
    # Another chain's: block 1 under another hash. Out of reach: blocks not ingested.
    theirs = f"sqlite:///{tmp_path}/theirs.db"
    await make_sink_at(theirs, 1, [(1, block_hash(1, branch=2), [1])])
    unheld = f"sqlite:///{tmp_path}/unheld.db"
    await make_sink_at(unheld, 1, [(100, block_hash(100), [1])])
    store = await open_store(parse_blockdb_url(chain_url), read_only=True)
    try:
        for url, refusal in (
            (theirs, f"are not chain {CHAIN_ID}'s .*block 1 of table 'volume' has hash"),
            (unheld, r"holds none of their blocks \(blocks 100..100\)"),
        ):
            sink = await open_sink(parse_blockdb_url(url))
            try:
                with pytest.raises(SinkRejected, match=refusal):
                    await planning_chain(store, sink)
                assert await sink.unmarked()
            finally:
                await sink.close()
        sink = await open_sink(parse_blockdb_url(ours))
        try:
            assert await planning_chain(store, sink) == CHAIN_ID
            assert {r["chain_id"] for r in await sink.rows(TABLE)} == {CHAIN_ID}
            assert [w["block_number"] for w in await sink.written(TABLE, CHAIN_ID)] == [1, 2]
            # Marked: planning again reads the chain id and changes nothing.
            assert await planning_chain(store, sink) == CHAIN_ID
        finally:
            await sink.close()
    finally:
        await store.close()
    empty = await open_store(parse_blockdb_url(f"sqlite:///{tmp_path}/empty.db"))
    sink = await open_sink(parse_blockdb_url(ours))
    try:
        with pytest.raises(StoreError, match="holds no chain yet"):
            await planning_chain(empty, sink)
    finally:
        await sink.close()
        await empty.close()
