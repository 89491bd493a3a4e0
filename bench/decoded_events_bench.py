"""Decoded events benchmark: a function called once per ERC-20 ``Transfer`` with its
decoded arguments, through the bundle cluster (``unit: "event"``) versus a
hand-written pipeline that decodes with the same library.

Run: uv run python bench/decoded_events_bench.py [--logs 100000] [--tasks 10]
     [--in-flight 4] [--rounds 3] [--cache-dir DIR]

The data: a SQLite block database of ``--logs`` ERC-20 ``Transfer`` logs, 100 a
block (random senders, receivers, tokens of ten and uint256 amounts), written once
through the store's write API and cached under ``--cache-dir`` (default:
``$TMPDIR/blockx-bench``), with the ERC-20 ABI registered as ``erc20``. The same
function (``transfer``: one row per transfer, from its decoded arguments) in two
ways, over the same blocks cut into ``--tasks`` ranges, ``--in-flight`` at a time:

* ``blockx``: etcd, a real ``blockx-bundle-coordinator`` and a
  ``blockx-bundle-worker`` with 2 executors; ``BlockBundleCallConfig`` tasks with
  ``unit: "event"``, ``abi: "erc20"``, ``event: "Transfer"`` (the Worker decodes
  each log through ``io.logicalTypes``, ``faster-eth-abi``) and
  ``BlockBundleWriteResultHandler`` into a SQLite sink; wall clock from the first
  submission to the last result;
* ``hand``: what a user writes by hand: asyncio with a ``ProcessPoolExecutor(2)``;
  per range, one query reads the range's Transfer logs, a pool process decodes
  each with ``faster-eth-abi`` (topics and data, addresses lowercased) and calls
  the same function, and the rows are written with ``executemany`` in one
  transaction per range into another SQLite file; the pool is warm.

One untimed warm-up round of each runs first. Prints calls/s of each, the ratio
(goal: blockx >= 1.0 x hand), whether both wrote identical rows, and one JSON line.
Each figure is the median of ``--rounds`` rounds, the kinds interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from backfill_bench import BundleCluster

from blockx_chain.abi.spec import entries_json, entry_from_signature
from blockx_chain.schema import TRANSFER_TOPIC, Block, BlockRows, Log
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_client import Client, PluginConfig, Task

PER_BLOCK: Final = 100
TRANSFER: Final = "event Transfer(address indexed from, address indexed to, uint256 value)"
FUNCTION: Final = '''
def transfer(arg):
    """One ERC-20 transfer as a row, from its decoded arguments."""
    args = arg["event"]["args"]
    return {
        "log_index": arg["log"]["log_index"],
        "token": arg["log"]["address"],
        "sender": args["from"],
        "receiver": args["to"],
        "value": args["value"],
    }
'''
COLUMNS: Final = {"token": "TEXT", "sender": "TEXT", "receiver": "TEXT", "value": "NUMERIC"}
KEY: Final = ["block_number", "log_index"]
OUT_COLUMNS: Final = "block_number, log_index, token, sender, receiver, value"


# ---- the data, written once --------------------------------------------------------------


def _word(value: int) -> str:
    return f"{value:064x}"


def _blocks(count: int, seed: int = 7) -> list[BlockRows]:
    rng = random.Random(seed)
    tokens = ["0x" + rng.randbytes(20).hex() for _ in range(10)]
    holders = ["0x" + rng.randbytes(20).hex() for _ in range(500)]
    out = []
    for number in range(count):
        block_hash = "0x" + f"{number + 1:064x}"
        parent = "0x" + f"{number:064x}"
        logs = [
            Log(
                block_number=number,
                log_index=i,
                transaction_index=i,
                transaction_hash="0x" + f"{number:032x}{i:032x}",
                block_hash=block_hash,
                address=rng.choice(tokens),
                topic0=TRANSFER_TOPIC,
                topic1="0x" + "00" * 12 + rng.choice(holders)[2:],
                topic2="0x" + "00" * 12 + rng.choice(holders)[2:],
                topic3=None,
                data="0x" + _word(rng.randrange(2**256)),
            )
            for i in range(PER_BLOCK)
        ]
        block = Block(
            block_number=number,
            block_hash=block_hash,
            parent_hash=parent,
            timestamp=1_700_000_000 + number,
            miner="0x" + "00" * 20,
            gas_used=0,
            gas_limit=30_000_000,
            base_fee_per_gas=None,
            transaction_count=0,
        )
        out.append(BlockRows(block=block, logs=logs))
    return out


async def write_chain(path: Path, blocks: int) -> None:
    store = await open_store(parse_blockdb_url(f"sqlite:///{path}"))
    try:
        rows = _blocks(blocks)
        async with store.writer() as w:
            await w.init_chain(31337, "0x" + "00" * 31 + "01")
            for lo in range(0, blocks, 100):
                await w.insert_blocks(rows[lo : lo + 100])
            head = rows[-1].block
            await w.set_chain(
                head_number=head.block_number,
                head_hash=head.block_hash,
                finalized_number=head.block_number,
                epoch=0,
            )
            await w.put_abi("erc20", entries_json([entry_from_signature(TRANSFER)]), [])
    finally:
        await store.close()


def chain_file(cache_dir: Path, logs: int) -> Path:
    blocks = -(-logs // PER_BLOCK)
    path = cache_dir / f"transfers-{blocks}x{PER_BLOCK}.db"
    if path.exists():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    print(f"writing {blocks * PER_BLOCK:,} Transfer logs into {path} (once)...", file=sys.stderr)
    asyncio.run(write_chain(partial, blocks))
    with contextlib.closing(sqlite3.connect(partial)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE")
    partial.rename(path)
    return path


def ranges(blocks: int, tasks: int) -> list[tuple[int, int]]:
    per = -(-blocks // tasks)
    return [(lo, min(lo + per, blocks) - 1) for lo in range(0, blocks, per)]


# ---- blockx: the bundle cluster --------------------------------------------------------


def event_task(lo: int, hi: int, table: str, task_id: str) -> Task:
    scan = {
        "function": "transfer",
        "table": "logs",
        "unit": "event",
        "abi": "erc20",
        "event": "Transfer",
        "fromBlock": lo,
        "toBlock": hi,
        "bundleSize": hi - lo + 1,
    }
    writer = {"table": table, "key": KEY, "columns": COLUMNS}
    return Task(
        function_call_config=PluginConfig(type="BlockBundleCallConfig", config=scan),
        result_handler=PluginConfig(type="BlockBundleWriteResultHandler", config=writer),
        task_id=task_id,
    )


async def run_blockx(
    client: Client, spans: list[tuple[int, int]], table: str, in_flight: int
) -> float:
    tasks = [event_task(lo, hi, table, f"bench-{table}-{lo}") for lo, hi in spans]
    started = time.perf_counter()
    async for result in client.run_many(tasks, concurrency=in_flight):
        if not result.ok:
            raise RuntimeError(f"{result.task_id}: {result.failure_code} {result.failure_message}")
    return time.perf_counter() - started


# ---- by hand: asyncio + ProcessPoolExecutor + faster-eth-abi ----------------------------

_FUNCTION: Callable[[dict[str, Any]], dict[str, Any]] | None = None
_RANGE_SQL: Final = (
    "SELECT * FROM logs WHERE block_number BETWEEN ? AND ? AND topic0 = ? "
    "ORDER BY block_number, log_index"
)


def _transfer(functions: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    global _FUNCTION
    if _FUNCTION is None:
        spec = importlib.util.spec_from_file_location("bench_events", functions)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FUNCTION = module.transfer
    return _FUNCTION


def warm(functions: str) -> None:
    import faster_eth_abi  # noqa: F401  (loaded before the timed rounds)

    _transfer(functions)


def compute_range(functions: str, logs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Decode each Transfer (topics 1 and 2, then the data) and call the function."""
    from faster_eth_abi import decode

    function = _transfer(functions)
    out: list[tuple[Any, ...]] = []
    for log in logs:
        sender, receiver = decode(
            ["address", "address"], bytes.fromhex(log["topic1"][2:] + log["topic2"][2:])
        )
        (value,) = decode(["uint256"], bytes.fromhex(log["data"][2:]))
        event = {
            "name": "Transfer",
            "signature": "Transfer(address,address,uint256)",
            "args": {"from": sender.lower(), "to": receiver.lower(), "value": value},
        }
        row = function({"block": {"block_number": log["block_number"]}, "log": log, "event": event})
        out.append(
            (
                log["block_number"],
                row["log_index"],
                row["token"],
                row["sender"],
                row["receiver"],
                str(row["value"]),
            )
        )
    return out


def read_range(chain: Path, lo: int, hi: int) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(f"file:{chain}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(_RANGE_SQL, (lo, hi, TRANSFER_TOPIC))]


def create_out(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(
        "CREATE TABLE transfers (block_number INTEGER, log_index INTEGER, token TEXT, "
        "sender TEXT, receiver TEXT, value TEXT, PRIMARY KEY (block_number, log_index))"
    )
    return db


def write_range(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.executemany(f"INSERT INTO transfers ({OUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.execute("COMMIT")


async def run_hand(
    pool: ProcessPoolExecutor,
    functions: str,
    chain: Path,
    out: Path,
    spans: list[tuple[int, int]],
    in_flight: int,
) -> float:
    loop = asyncio.get_running_loop()
    db = create_out(out)
    gate = asyncio.Semaphore(in_flight)
    write_lock = asyncio.Lock()

    async def one(lo: int, hi: int) -> None:
        async with gate:
            logs = await asyncio.to_thread(read_range, chain, lo, hi)
            rows = await loop.run_in_executor(pool, compute_range, functions, logs)
            async with write_lock:
                await asyncio.to_thread(write_range, db, rows)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(lo, hi) for lo, hi in spans))
        return time.perf_counter() - started
    finally:
        db.close()


# ---- comparing ---------------------------------------------------------------------------


def table_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return [
            (*row[:5], str(row[5]))
            for row in db.execute(
                f"SELECT {OUT_COLUMNS} FROM {table} ORDER BY block_number, log_index"
            )
        ]


async def bench(
    args: argparse.Namespace, chain: Path, spans: list[tuple[int, int]], work: Path, log: Any
) -> dict[str, Any]:
    functions = work / "functions"
    functions.mkdir()
    (functions / "bench_events.py").write_text(FUNCTION)
    module = str(functions / "bench_events.py")
    sink = work / "sink.db"
    times: dict[str, list[float]] = {"blockx": [], "hand": []}
    cluster = BundleCluster(chain, sink, log, {"FUNCTIONS_DIR": str(functions)})
    try:
        await cluster.start()
        async with Client(bundle_coordinator=cluster.coordinator) as client:
            await run_blockx(client, spans, "warmup", args.in_flight)
            with ProcessPoolExecutor(2) as pool:
                await asyncio.gather(
                    *(asyncio.wrap_future(pool.submit(warm, module)) for _ in range(2))
                )
                await run_hand(pool, module, chain, work / "hand-warmup.db", spans, args.in_flight)
                for r in range(args.rounds):
                    times["blockx"].append(
                        await run_blockx(client, spans, f"transfers_{r}", args.in_flight)
                    )
                    times["hand"].append(
                        await run_hand(
                            pool, module, chain, work / f"hand-{r}.db", spans, args.in_flight
                        )
                    )
    finally:
        await cluster.stop()
    blockx_rows = table_rows(sink, "transfers_0")
    hand_rows = table_rows(work / "hand-0.db", "transfers")
    calls = len(hand_rows)
    median = {kind: statistics.median(seconds) for kind, seconds in times.items()}
    return {
        "logs": calls,
        "tasks": len(spans),
        "seconds": {k: round(v, 3) for k, v in median.items()},
        "calls_per_s": {k: round(calls / v) for k, v in median.items()},
        "blockx_over_hand": round(median["hand"] / median["blockx"], 3),
        "identical_rows": blockx_rows == hand_rows and len(blockx_rows) == calls,
        "rounds": {k: [round(s, 3) for s in v] for k, v in times.items()},
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    per_s, secs = result["calls_per_s"], result["seconds"]
    print(
        f"\ndecoded Transfer events: {result['logs']:,} calls in {result['tasks']} ranges, "
        f"{args.in_flight} in flight, 2 processes, median of {args.rounds} rounds"
    )
    print(f"{'pipeline':<44}{'seconds':>9}{'calls/s':>11}{'vs hand':>9}")
    names = {
        "blockx": 'blockx (bundle cluster, unit "event")',
        "hand": "by hand (asyncio + 2 processes decoding)",
    }
    for kind, name in names.items():
        print(f"{name:<44}{secs[kind]:>9.3f}{per_s[kind]:>11,}{per_s[kind] / per_s['hand']:>8.2f}x")
    print(f"blockx / hand: {result['blockx_over_hand']:.2f}x (goal >= 1.0)")
    print(f"identical rows (blockx sink vs by hand): {result['identical_rows']}")
    print(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--logs", type=int, default=100_000)
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blockx-bench")
    args = p.parse_args()
    chain = chain_file(args.cache_dir, args.logs)
    blocks = -(-args.logs // PER_BLOCK)
    spans = ranges(blocks, args.tasks)
    work = Path(tempfile.mkdtemp(prefix="blockx-events-bench-"))
    try:
        with open(work / "cluster.log", "w") as log:
            result = asyncio.run(bench(args, chain, spans, work, log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(result, args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
