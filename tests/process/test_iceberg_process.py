"""The lake end to end on real clusters (a bundle cluster for ``blockx backfill``,
a block cluster for ``blockx follow``, their Workers writing one Iceberg SQL
catalog on SQLite with a local warehouse): a backfill into an Iceberg table, read
back with DuckDB through pyiceberg's ``scan().to_duckdb()``, equals the same
backfill into a SQLite sink; a re-run skips it all and ``--force`` leaves the same
rows; a reorg followed by ``follow`` rewrites exactly the abandoned blocks'
rows."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_cluster import ChainCluster
from chain_rows import CHAIN_ID, block_hash, make_block, seed_chain, shorten_chain

from blockx_chain.lake import LakeConfig
from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.registry import RegistryKind
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def transfer(row):
    return {"log_index": row["log_index"], "data": row["data"]}
"""
BLOCKS = 60
PER_TASK = 10
WHERE = json.dumps({"topic0": TRANSFER_TOPIC})
LAKE_WRITER = "IcebergWriteResultHandler"


class Setup:
    def __init__(self, root: Path, bundle: ChainCluster, block: ChainCluster) -> None:
        self.root = root
        self.bundle = bundle
        self.block = block
        self.chain_url = f"sqlite:///{root}/chain.db"
        self.sink_url = f"sqlite:///{root}/sink.db"
        self.lake_url = f"sqlite:///{root}/lake.db"
        self.warehouse = str(root / "warehouse")

    def source(self) -> list[str]:
        return ["--function", "transfer", "--source-table", "logs", "--where", WHERE]


@pytest.fixture(scope="module")
def setup(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("lake")
    functions = root / "functions"
    functions.mkdir()
    (functions / "transfers.py").write_text(FUNCTIONS)
    chain_url = f"sqlite:///{root}/chain.db"
    asyncio.run(seed_chain(chain_url, BLOCKS))
    lake = {
        "ICEBERG_CATALOG_URI": f"sqlite:///{root}/lake.db",
        "ICEBERG_WAREHOUSE": str(root / "warehouse"),
    }
    bundle, block = (
        ChainCluster(
            etcd_server,
            root,
            kind,
            chain_url=chain_url,
            sink_url=f"sqlite:///{root}/sink.db",
            functions=functions,
            **lake,
        )
        for kind in (RegistryKind.BUNDLE, RegistryKind.BLOCK)
    )
    with bundle.serving(), block.serving():
        yield Setup(root, bundle, block)


def expected_rows(blocks: dict[int, int]) -> list[tuple[Any, ...]]:
    """The rows ``transfer`` gives for these blocks (number → branch), from the
    chain without BlockX."""
    return [
        (n, block_hash(n, branch), index, log.log_index, log.data)
        for n, branch in sorted(blocks.items())
        for index, log in enumerate(
            log for log in make_block(n, branch=branch).logs if log.topic0 == TRANSFER_TOPIC
        )
    ]


_SHAPED = (
    "SELECT block_number, block_hash, row_index, log_index, data FROM t "
    "WHERE chain_id = ? ORDER BY block_number, row_index"
)


def lake_rows(setup: Setup, table: str) -> list[tuple[Any, ...]]:
    """The lake table's rows, read back by DuckDB (through pyiceberg's scan)."""
    from pyiceberg.catalog import load_catalog

    config = LakeConfig(uri=setup.lake_url, warehouse=setup.warehouse)
    catalog = load_catalog("blockx", **config.catalog_properties())
    connection = catalog.load_table(("blockx", table)).scan().to_duckdb(table_name="t")
    return [tuple(row) for row in connection.execute(_SHAPED, [CHAIN_ID]).fetchall()]


async def sql_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        rows = await sink.rows(table)
    finally:
        await sink.close()
    return [
        (r["block_number"], r["block_hash"], r["row_index"], r["log_index"], r["data"])
        for r in rows
        if r["chain_id"] == CHAIN_ID
    ]


async def ledger(url: str, table: str) -> list[tuple[int, str]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        return [(w["block_number"], w["block_hash"]) for w in await sink.written(table, CHAIN_ID)]
    finally:
        await sink.close()


async def blockx(*argv: str) -> asyncio.subprocess.Process:
    program = shutil.which("blockx")
    assert program is not None
    return await asyncio.create_subprocess_exec(
        program,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )


async def backfill(setup: Setup, sink_db: str, *extra: str) -> list[dict[str, Any]]:
    proc = await blockx(
        *setup.bundle.cli_args(),
        "backfill",
        *setup.source(),
        *("--from", "0", "--to", str(BLOCKS - 1), "--blocks-per-task", str(PER_TASK)),
        *("--sink-table", "transfers", "--db", setup.chain_url, "--sink-db", sink_db),
        *("--json", *extra),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_a_backfill_into_the_lake_equals_one_into_sqlite(setup: Setup) -> None:
    await backfill(setup, setup.sink_url)
    events = await backfill(setup, setup.lake_url, "--writer", LAKE_WRITER)
    done = events[-1]
    assert (done["event"], done["blocks"], done["failed"]) == ("done", BLOCKS, 0)
    assert done["rows"] == len(expected_rows(dict.fromkeys(range(BLOCKS), 0)))
    in_sqlite = await sql_rows(setup.sink_url, "transfers")
    assert in_sqlite == expected_rows(dict.fromkeys(range(BLOCKS), 0))
    assert lake_rows(setup, "transfers") == in_sqlite
    every_block = [(n, block_hash(n)) for n in range(BLOCKS)]
    assert await ledger(setup.lake_url, "transfers") == every_block
    tasks = [e for e in events if e["event"] == "task" and e["outcome"] == "written"]
    assert len(tasks) == BLOCKS // PER_TASK

    # A re-run skips every range; a forced one rewrites them to the same rows.
    again = await backfill(setup, setup.lake_url, "--writer", LAKE_WRITER)
    assert again[0]["skipped_tasks"] == BLOCKS // PER_TASK
    assert again[-1]["tasks"] == 0
    forced = await backfill(setup, setup.lake_url, "--writer", LAKE_WRITER, "--force")
    assert forced[-1]["blocks"] == BLOCKS
    assert lake_rows(setup, "transfers") == in_sqlite
    assert await ledger(setup.lake_url, "transfers") == every_block


async def test_follow_rewrites_exactly_the_abandoned_blocks_rows(setup: Setup) -> None:
    top = BLOCKS - 1
    start = top - 5
    proc = await blockx(
        *setup.block.cli_args(),
        "follow",
        *setup.source(),
        *("--sink-table", "followed", "--from", str(start), "--writer", LAKE_WRITER),
        *("--db", setup.chain_url, "--sink-db", setup.lake_url, "--json"),
    )
    events: list[dict[str, Any]] = []

    async def read_until(blocks: dict[int, int]) -> None:
        """Until follow reported each of these blocks (number → branch) written."""
        wanted = {(n, block_hash(n, branch)) for n, branch in blocks.items()}
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while not wanted <= {(e["number"], e["hash"]) for e in events if e["event"] == "block"}:
                line = await proc.stdout.readline()
                assert line, "follow ended"
                events.append(json.loads(line))

    try:
        before = dict.fromkeys(range(start, top + 1), 0)
        await read_until(before)
        assert lake_rows(setup, "followed") == expected_rows(before)
        # A reorg the way ingest applies one: the blocks above the fork dropped, the
        # new branch written, one block long (two blocks fewer).
        fork = top - 3
        store = await open_store(parse_blockdb_url(setup.chain_url))
        try:
            await shorten_chain(store, fork=fork, depth=3, old_head_hash=block_hash(top))
        finally:
            await store.close()
        await read_until({fork + 1: 9})
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert "Traceback" not in err.decode()
    events += [json.loads(line) for line in out.decode().splitlines()]
    [reorg] = [e for e in events if e["event"] == "reorg"]
    assert (reorg["rewritten"], reorg["deleted"]) == ([fork + 1], [fork + 2, fork + 3])
    after = {**dict.fromkeys(range(start, fork + 1), 0), fork + 1: 9}
    assert lake_rows(setup, "followed") == expected_rows(after)
    assert await ledger(setup.lake_url, "followed") == [
        (n, block_hash(n, branch)) for n, branch in sorted(after.items())
    ]
