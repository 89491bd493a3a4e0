"""Ingest benchmark: blocks/s from anvil into SQLite and PostgreSQL, against the raw
ceiling of the node.

Run: uv run python bench/ingest_bench.py [--blocks 1000] [--batch-size 50]
     [--in-flight 4] [--rounds 3] [--postgres URL]

Prints one JSON line. In one run, against one anvil holding ``--blocks`` blocks of
8 ERC-20 and 4 ETH transfers each (the devnet's defaults):

* ``raw``: the requests ingest sends (``eth_getBlockByNumber(n, true)`` and
  ``eth_getBlockReceipts(n)`` for every block, ``--batch-size`` blocks per
  JSON-RPC batch, ``--in-flight`` batches at a time, through the same client),
  with the answers thrown away: what the node can serve, the ceiling;
* ``sqlite`` and ``postgres``: ``blockx_chain.ingest.ingest`` of the whole chain
  into a fresh database, wall clock from the call to its return (opening the
  database, the chain check and the lock included);
* ratios to the raw ceiling (goal: SQLite >= 0.8).

Each figure is the median of ``--rounds`` rounds, the kinds interleaved so drift
of the machine hits all alike. PostgreSQL is the server at ``--postgres``, or
one started for the run from Debian's binaries (as the tests do), or skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import asyncpg

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import EthRpc, JsonRpcClient
from blockx_chain.url import parse_blockdb_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from postgres import PostgresServer, find_postgres_bin


async def mine(url: str, blocks: int) -> int:
    async with JsonRpcClient(url) as client:
        net = Devnet(client)
        await net.setup(tokens=3)
        mined = await net.mine(blocks)
        return mined[-1].number


async def raw_ceiling(url: str, head: int, batch_size: int, in_flight: int) -> float:
    """Seconds to fetch blocks 0..head the way ingest does, answers discarded."""
    started = time.perf_counter()
    async with JsonRpcClient(url, max_batch=2 * batch_size) as client:
        eth = EthRpc(client)

        async def fetch(numbers: list[int]) -> None:
            await asyncio.gather(
                eth.get_blocks(numbers, full=True), eth.get_block_receipts(numbers)
            )

        pending: deque[asyncio.Task[None]] = deque()
        for start in range(0, head + 1, batch_size):
            numbers = list(range(start, min(start + batch_size, head + 1)))
            if len(pending) >= in_flight:
                await pending.popleft()
            pending.append(asyncio.create_task(fetch(numbers)))
        while pending:
            await pending.popleft()
    return time.perf_counter() - started


async def ingest_seconds(url: str, db_url: str, batch_size: int, in_flight: int) -> float:
    started = time.perf_counter()
    summary = await ingest(
        url,
        parse_blockdb_url(db_url),
        IngestOptions(batch_size=batch_size, in_flight=in_flight),
    )
    seconds = time.perf_counter() - started
    assert summary.reorgs == 0
    return seconds


async def fresh_postgres_db(server_url: str) -> str:
    name = f"bench_{secrets.token_hex(4)}"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    base, _, _ = server_url.rpartition("/")
    return f"{base}/{name}"


async def run(args: argparse.Namespace, url: str, postgres: str | None) -> dict[str, Any]:
    head = await mine(url, args.blocks)
    blocks = head + 1
    times: dict[str, list[float]] = {"raw": [], "sqlite": []}
    if postgres is not None:
        times["postgres"] = []
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as folder:
        for round_ in range(args.rounds):
            times["raw"].append(await raw_ceiling(url, head, args.batch_size, args.in_flight))
            db = f"sqlite:///{folder}/round{round_}.db"
            times["sqlite"].append(await ingest_seconds(url, db, args.batch_size, args.in_flight))
            if postgres is not None:
                db = await fresh_postgres_db(postgres)
                seconds = await ingest_seconds(url, db, args.batch_size, args.in_flight)
                times["postgres"].append(seconds)
    rate = {kind: blocks / statistics.median(values) for kind, values in times.items()}
    result: dict[str, Any] = {
        "blocks": blocks,
        "transactions_per_block": 12,
        "batch_size": args.batch_size,
        "in_flight": args.in_flight,
        "rounds": args.rounds,
        "blocks_per_s": {kind: round(value, 1) for kind, value in rate.items()},
        "sqlite_vs_raw": round(rate["sqlite"] / rate["raw"], 3),
    }
    if postgres is not None:
        result["postgres_vs_raw"] = round(rate["postgres"] / rate["raw"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default=None, help="a server URL (postgresql://.../postgres)")
    args = parser.parse_args()
    server: PostgresServer | None = None
    postgres = args.postgres
    if postgres is None:
        bin_dir = find_postgres_bin()
        if bin_dir is not None:
            server = PostgresServer(bin_dir)
            server.start()
            postgres = server.url()
    try:
        with Anvil() as node:
            result = asyncio.run(run(args, node.url, postgres))
    finally:
        if server is not None:
            server.stop()
    if postgres is None:
        result["postgres"] = "skipped: PostgreSQL is not installed (scripts/setup.sh)"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
