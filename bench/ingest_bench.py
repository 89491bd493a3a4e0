"""Ingest benchmark: blocks/s from anvil into SQLite and PostgreSQL, against the raw
ceiling of the node.

Run: uv run python bench/ingest_bench.py [--blocks 1000] [--batch-size 50]
     [--in-flight 4] [--rounds 3] [--postgres URL] [--traces]

Prints one JSON line. In one run, against one anvil holding ``--blocks`` blocks of
8 ERC-20 and 4 ETH transfers each (the devnet's defaults):

* ``raw``: the requests ingest sends (``eth_getBlockByNumber(n, true)`` and
  ``eth_getBlockReceipts(n)`` for every block, ``--batch-size`` blocks per
  JSON-RPC batch, ``--in-flight`` batches at a time, through the same client),
  with the answers thrown away: what the node can serve, the ceiling;
* ``sqlite`` and ``postgres``: ``blockx_chain.ingest.ingest`` of the whole chain
  into a fresh database, wall clock from the call to its return (opening the
  database, the chain check and the lock included);
* ratios to the raw ceiling (goal: SQLite >= 0.8);
* the CPU seconds anvil and this process spent per round: on a small machine
  anvil's own CPU at the ceiling bounds what ingest's work can add without
  slowing the node down.

With ``--traces`` the chain also holds a swap per block on the devnet's pair (one
in eight a ``probe()``: creations, a reverted inner call, selfdestructs), and
each round adds ``sqlite_traces`` (and ``postgres_traces``): the same ingest with
``--traces``, every block's call frames asked with ``debug_traceBlockByNumber``;
``traces_cost`` is the plain ingest's blocks/s over the traced one's.

Each figure is the median of ``--rounds`` rounds, the kinds interleaved so drift
of the machine hits all alike. PostgreSQL is the server at ``--postgres``, or
one started for the run from Debian's binaries (as the tests do), or skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import asyncpg

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import EthRpc, JsonRpcClient
from blockx_chain.url import parse_blockdb_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from postgres import PostgresServer, find_postgres_bin


async def mine(url: str, blocks: int, swaps: int) -> int:
    async with JsonRpcClient(url) as client:
        net = Devnet(client)
        await net.setup(tokens=3)
        if swaps:
            await net.setup_pair()
        mined = await net.mine(blocks, swaps=swaps)
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


async def ingest_seconds(
    url: str, db_url: str, batch_size: int, in_flight: int, traces: bool = False
) -> float:
    started = time.perf_counter()
    summary = await ingest(
        url,
        parse_blockdb_url(db_url),
        IngestOptions(batch_size=batch_size, in_flight=in_flight, traces=traces),
    )
    assert summary.traces > 0 or not traces
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


def anvil_cpu_s() -> float:
    """CPU seconds the anvil child of this process has used so far (Linux /proc)."""
    me = os.getpid()
    children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
    for pid in children:
        if Path(f"/proc/{pid}/comm").read_text().strip() == "anvil":
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            # utime and stime, fields 14 and 15 of stat (11 and 12 after the name).
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


class Measure:
    """Wall seconds, this process's CPU seconds and anvil's, per kind and round."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.anvil: dict[str, list[float]] = {}

    async def run(self, kind: str, work: Coroutine[Any, Any, float]) -> None:
        cpu, anvil = time.process_time(), anvil_cpu_s()
        self.wall.setdefault(kind, []).append(await work)
        self.cpu.setdefault(kind, []).append(time.process_time() - cpu)
        self.anvil.setdefault(kind, []).append(anvil_cpu_s() - anvil)


async def run(args: argparse.Namespace, url: str, postgres: str | None) -> dict[str, Any]:
    swaps = 1 if args.traces else 0
    head = await mine(url, args.blocks, swaps)
    blocks = head + 1
    size, flight = args.batch_size, args.in_flight
    measure = Measure()
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as folder:
        for round_ in range(args.rounds):
            await measure.run("raw", raw_ceiling(url, head, size, flight))
            db = f"sqlite:///{folder}/round{round_}.db"
            await measure.run("sqlite", ingest_seconds(url, db, size, flight))
            if args.traces:
                db = f"sqlite:///{folder}/round{round_}-traces.db"
                await measure.run("sqlite_traces", ingest_seconds(url, db, size, flight, True))
            if postgres is not None:
                db = await fresh_postgres_db(postgres)
                await measure.run("postgres", ingest_seconds(url, db, size, flight))
                if args.traces:
                    db = await fresh_postgres_db(postgres)
                    traced = ingest_seconds(url, db, size, flight, True)
                    await measure.run("postgres_traces", traced)
    rate = {kind: blocks / statistics.median(values) for kind, values in measure.wall.items()}
    result: dict[str, Any] = {
        "blocks": blocks,
        "transactions_per_block": 12 + swaps,
        "batch_size": size,
        "in_flight": flight,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "blocks_per_s": {kind: round(value, 1) for kind, value in rate.items()},
        "sqlite_vs_raw": round(rate["sqlite"] / rate["raw"], 3),
        # Where the time goes: anvil's CPU and this process's (the ingest, or the
        # raw client), median per round.
        "cpu_s": {
            kind: {
                "anvil": round(statistics.median(measure.anvil[kind]), 3),
                "bench": round(statistics.median(measure.cpu[kind]), 3),
            }
            for kind in measure.wall
        },
    }
    if postgres is not None:
        result["postgres_vs_raw"] = round(rate["postgres"] / rate["raw"], 3)
    if args.traces:
        engines = ["sqlite"] + (["postgres"] if postgres is not None else [])
        result["traces_cost"] = {
            engine: round(rate[engine] / rate[f"{engine}_traces"], 2) for engine in engines
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default=None, help="a server URL (postgresql://.../postgres)")
    parser.add_argument(
        "--traces", action="store_true", help="swaps in the chain; measure ingest --traces too"
    )
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
