"""The local cluster's chain as ``blockx dev up`` runs it: anvil fed with test tokens
and live blocks, an ingest following the head into the block database, and both
clusters reading it and writing the sink (a bundle task and a block task of the
example ``token_volume``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blockx_chain.devnet.anvil import DEFAULT_CHAIN_ID
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster import LocalCluster
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_client import Client

ROOT = Path(__file__).resolve().parents[2]
HISTORY = 200  # blockx-dev's default --blocks; the 2 setup blocks come first


@pytest.fixture(scope="module")
def fed() -> Iterator[dict[str, Any]]:
    local = LocalCluster(ROOT / "examples", feed=True)
    try:
        yield local.wait_ready()
    finally:
        assert local.stop() == 0


async def ingested_head(url: str, at_least: int, timeout_s: float = 30) -> dict[str, Any]:
    store = await open_store(parse_blockdb_url(url))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            head = await store.head()
            if head is not None and head["number"] >= at_least:
                return head
            assert time.monotonic() < deadline, f"ingest did not reach block {at_least}: {head}"
            await asyncio.sleep(0.2)
    finally:
        await store.close()


async def test_ingest_follows_and_both_clusters_write_the_sink(fed: dict[str, Any]) -> None:
    head = await ingested_head(fed["block_db_url"], HISTORY + 2)
    # Live mining goes on: a block above the history arrives too.
    live = await ingested_head(fed["block_db_url"], head["number"] + 1)
    job = ChainJob(sink_table="dev_volume")
    async with Client(
        coordinator=fed["coordinator"], bundle_coordinator=fed["bundle_coordinator"]
    ) as client:
        backfill = await client.run(job.bundle_task(0, head["number"], 50, "dev-chain-bundle"))
        assert backfill.ok, backfill
        block = await client.run(job.block_task(live["number"], live["hash"], "dev-chain-block"))
        assert block.ok, block
    assert backfill.outputs() == {
        "table": "dev_volume",
        "bundles": -(-(head["number"] + 1) // 50),
        "blocks": head["number"] + 1,
        "rows": backfill.outputs()["rows"],
    }
    sink = await open_sink(parse_blockdb_url(fed["sink_db_url"]))
    try:
        rows = await sink.rows("dev_volume")
        written = await sink.written("dev_volume", DEFAULT_CHAIN_ID)
    finally:
        await sink.close()
    assert [w["block_number"] for w in written] == [*range(head["number"] + 1), live["number"]]
    assert {w["block_hash"] for w in written if w["block_number"] == live["number"]} == {
        live["hash"]
    }
    # 4 token transfers a block over 3 tokens: each history block has rows.
    assert {r["block_number"] for r in rows} >= set(range(2, head["number"] + 1))
    assert sum(r["transfers"] for r in rows if r["block_number"] > 1) >= 4 * HISTORY
