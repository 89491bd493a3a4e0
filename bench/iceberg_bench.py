"""Iceberg benchmark: the same backfill into an Iceberg table of the lake and into a
SQLite sink table, through one bundle cluster.

Run: uv run python bench/iceberg_bench.py [--blocks 10000] [--blocks-per-task 1000]
     [--in-flight 4] [--rounds 3] [--cache-dir DIR]

The chain and the cluster are ``backfill_bench.py``'s (anvil + ``Devnet``, ingested
once into a SQLite block database cached under ``--cache-dir``; etcd, a
``blockx-bundle-coordinator`` and a ``blockx-bundle-worker`` with 2 executors), the
Worker given both a SQLite sink and a lake (a pyiceberg SQL catalog on SQLite with a
local warehouse). Over blocks ``0..--blocks - 1``, ``token_volume`` (unit
``block``) in ``BlockBundleCallConfig`` tasks of ``--blocks-per-task`` blocks,
``--in-flight`` at a time, written two ways:

* ``sqlite``: ``BlockBundleWriteResultHandler``, one transaction per task;
* ``iceberg``: ``IcebergWriteResultHandler``, one Iceberg commit per task (an
  overwrite of the task's blocks, its ledger written after it, old snapshots
  expired on the way).

One untimed warm-up round of each runs first; then ``--rounds`` rounds, the two
interleaved, each into a fresh table. Prints seconds and blocks/s (the median of
the rounds), the ratio iceberg / sqlite (goal: >= 0.5), whether the Iceberg table
read back with DuckDB (pyiceberg's ``scan().to_duckdb()``) holds the SQLite
table's rows, and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from backfill_bench import OUT_COLUMNS, SPARSE, BundleCluster, bundle_task, chain_file, ranges

from blockx_chain.lake import LakeConfig
from blockx_client import Client, PluginConfig, Task

LAKE_WRITER: Final = "IcebergWriteResultHandler"
SQL_WRITER: Final = "BlockBundleWriteResultHandler"


def task(lo: int, hi: int, table: str, writer: str) -> Task:
    """``backfill_bench``'s task over ``[lo, hi]``, written by ``writer``."""
    made = bundle_task(lo, hi, table, f"bench-{table}-{lo}")
    assert made.result_handler is not None
    handler = PluginConfig(type=writer, config=made.result_handler.config)
    return Task(
        function_call_config=made.function_call_config,
        result_handler=handler,
        task_id=made.task_id,
    )


async def run(
    client: Client, spans: list[tuple[int, int]], table: str, writer: str, in_flight: int
) -> float:
    tasks = [task(lo, hi, table, writer) for lo, hi in spans]
    started = time.perf_counter()
    async for result in client.run_many(tasks, concurrency=in_flight):
        if not result.ok:
            raise RuntimeError(f"{result.task_id}: {result.failure_code} {result.failure_message}")
    return time.perf_counter() - started


def sqlite_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute(f"SELECT {OUT_COLUMNS} FROM {table} ORDER BY block_number, token")
        return [(*row[:4], str(row[4]), row[5]) for row in rows.fetchall()]


def lake_rows(config: LakeConfig, table: str) -> list[tuple[Any, ...]]:
    """The lake table's rows, read back by DuckDB through pyiceberg's scan."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("blockx", **config.catalog_properties())
    duck = catalog.load_table((config.namespace, table)).scan().to_duckdb(table_name="t")
    rows = duck.execute(f"SELECT {OUT_COLUMNS} FROM t ORDER BY block_number, token").fetchall()
    return [(*row[:4], str(row[4]), row[5]) for row in rows]


async def bench(
    args: argparse.Namespace, chain: Path, spans: list[tuple[int, int]], work: Path, log: Any
) -> dict[str, Any]:
    sink = work / "sink.db"
    lake = LakeConfig(uri=f"sqlite:///{work}/lake.db", warehouse=str(work / "warehouse"))
    env = {"ICEBERG_CATALOG_URI": lake.uri, "ICEBERG_WAREHOUSE": str(lake.warehouse)}
    times: dict[str, list[float]] = {"sqlite": [], "iceberg": []}
    writers = {"sqlite": SQL_WRITER, "iceberg": LAKE_WRITER}
    # ("sqlite_" is a prefix no sink table may take.)
    prefixes = {"sqlite": "sql", "iceberg": "lake"}
    cluster = BundleCluster(chain, sink, log, env)
    try:
        await cluster.start()
        async with Client(bundle_coordinator=cluster.coordinator) as client:
            for kind, writer in writers.items():
                await run(client, spans, f"warmup_{prefixes[kind]}", writer, args.in_flight)
            for r in range(args.rounds):
                for kind, writer in writers.items():
                    table = f"{prefixes[kind]}_{r}"
                    seconds = await run(client, spans, table, writer, args.in_flight)
                    times[kind].append(seconds)
    finally:
        await cluster.stop()
    in_sqlite = sqlite_rows(sink, "sql_0")
    in_lake = await asyncio.to_thread(lake_rows, lake, "lake_0")
    median = {kind: statistics.median(seconds) for kind, seconds in times.items()}
    return {
        "blocks": args.blocks,
        "tasks": len(spans),
        "rows": len(in_sqlite),
        "seconds": {k: round(v, 3) for k, v in median.items()},
        "blocks_per_s": {k: round(args.blocks / v) for k, v in median.items()},
        "iceberg_over_sqlite": round(median["sqlite"] / median["iceberg"], 3),
        "identical_rows": in_lake == in_sqlite,
        "rounds": {k: [round(s, 3) for s in v] for k, v in times.items()},
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    per_s, secs = result["blocks_per_s"], result["seconds"]
    print(
        f"\nbackfill of {result['blocks']:,} blocks ({result['rows']:,} rows), "
        f"{result['tasks']} tasks of {args.blocks_per_task} blocks, {args.in_flight} in "
        f"flight, median of {args.rounds} rounds"
    )
    print(f"{'sink':<36}{'seconds':>9}{'blocks/s':>11}")
    names = {
        "sqlite": "SQLite (BlockBundleWriteResultHandler)",
        "iceberg": "Iceberg (one commit a task)",
    }
    for kind, name in names.items():
        print(f"{name:<36}{secs[kind]:>9.3f}{per_s[kind]:>11,}")
    print(f"iceberg / sqlite: {result['iceberg_over_sqlite']:.2f}x (goal >= 0.5)")
    print(f"identical rows (Iceberg via DuckDB vs SQLite): {result['identical_rows']}")
    print(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--blocks-per-task", type=int, default=1000)
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blockx-bench")
    args = p.parse_args()
    chain, generated = chain_file(args.cache_dir, args.blocks, SPARSE)
    spans = ranges(args.blocks, args.blocks_per_task)
    work = Path(tempfile.mkdtemp(prefix="blockx-iceberg-bench-"))
    try:
        with open(work / "cluster.log", "w") as log:
            result = asyncio.run(bench(args, chain, spans, work, log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["chain"] = {"file": str(chain), **generated}
    report(result, args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
