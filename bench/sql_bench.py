"""SQL through io.blockdb_executor against rows pulled into Python: the sum of ERC-20
transfer values per token over 1,000 blocks, both as functions on a real Sync Invoker.

Run: uv run python bench/sql_bench.py [--blocks 1000] [--transfers 20] [--tokens 5]
     [--rounds 15] [--postgres-url postgresql://postgres@127.0.0.1:5432/empty_db]

Prints one JSON line. The chain: an anvil devnet (``blockx_chain.devnet``) of
``--blocks`` blocks, each holding ``--transfers`` ERC-20 transfers among ``--tokens``
tokens, ingested with ``blockx chain ingest`` into a SQLite block database, or with
``--postgres-url`` (a superuser's URL of an empty database) into PostgreSQL, where
a read-only role is made for io.blockdb_executor as docs/blockdb-executor.md says. A
``blockx-syncinvoker`` (one executor, no read cache) serves two functions over the
same range:

* ``sql_totals``: ``io.blockdb_executor.query("SELECT token, count(*), sum(...) ...
  GROUP BY token")``: the database sums (SQLite: ``sum(CAST(value AS REAL))``;
  PostgreSQL: ``sum(value)``, exact);
* ``python_totals``: ``io.blockdb.rows("erc20_transfers", low, high)``, then
  ``int(value)`` summed per token in the function.

Each is invoked ``--rounds`` times, the two interleaved; the figure is the median wall
time of an invoke as the client sees it, and ``speedup`` is python / sql. The two
answers must agree (counts exactly, sums to 1e-9), or the run fails.

Measured on the 2-core development machine (1,000 blocks, 20,000 transfers, 15
rounds): SQLite sql_ms 13.3, python_ms 110.6, speedup 8.3; PostgreSQL sql_ms 9.8,
python_ms 133.3, speedup 13.6 (docs/blockdb-executor.md#benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.devnet.anvil import free_port
from blockx_chain.rpc import JsonRpcClient
from blockx_proto import syncinvoker_v1

FUNCTIONS = """
from blockx_executor import io

async def sql_totals(low, high, total):
    rows = await io.blockdb_executor.query(
        f"SELECT token, count(*) AS transfers, {total} AS total FROM erc20_transfers "
        "WHERE block_number BETWEEN ? AND ? GROUP BY token ORDER BY token",
        [low, high],
    )
    return {r["token"]: [r["transfers"], r["total"]] for r in rows}

async def python_totals(low, high, _total):
    totals = {}
    for row in await io.blockdb.rows("erc20_transfers", low, high):
        count, total = totals.get(row["token"], (0, 0))
        totals[row["token"]] = (count + 1, total + int(row["value"]))
    return {token: [count, total] for token, (count, total) in sorted(totals.items())}
"""


def _program(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


async def mine(url: str, blocks: int, tokens: int, transfers: int) -> int:
    """The devnet's blocks; the number of the last one."""
    async with JsonRpcClient(url) as client:
        net = Devnet(client)
        await net.setup(tokens=tokens)
        mined = await net.mine(blocks, token_transfers=transfers, eth_transfers=0)
        return int(mined[-1].number)


def ingest(url: str, db: str, last: int) -> None:
    command = [_program("blockx"), "chain", "ingest", "--rpc", url, "--db", db]
    command += ["--from", "0", "--to", str(last), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ingest failed ({done.returncode}): {done.stderr or done.stdout}")


async def invoke(channel: Channel, function: str, args: list[Any]) -> tuple[float, Any]:
    stub = syncinvoker_v1.SyncInvokerServiceStub(channel)
    started = time.perf_counter()
    reply = await stub.invoke(
        syncinvoker_v1.InvokeRequest(function=function, args=json.dumps(args)), timeout=120
    )
    seconds = time.perf_counter() - started
    if not reply.success:
        raise SystemExit(f"{function} failed: {reply.failure_message}")
    return seconds, json.loads(reply.result)


async def wait_serving(channel: Channel, proc: subprocess.Popen[bytes], args: list[Any]) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit("blockx-syncinvoker exited at start-up")
        try:
            await invoke(channel, "sql_totals", args)
            return
        except (OSError, TimeoutError, GRPCError):
            # Not listening, or not serving yet.
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def check_same(sql: dict[str, list[Any]], python: dict[str, list[Any]]) -> None:
    if sorted(sql) != sorted(python):
        raise SystemExit(f"the tokens differ: {sorted(sql)} vs {sorted(python)}")
    for token, (count, total) in python.items():
        sql_count, sql_total = sql[token]
        if sql_count != count or abs(float(sql_total) - total) > 1e-9 * total:
            raise SystemExit(f"{token}: SQL {sql[token]} vs Python {python[token]}")


async def read_only_role(url: str) -> str:
    """The role docs/blockdb-executor.md has the operator make; its URL."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE ROLE blockx_sql_bench LOGIN")
        await conn.execute(
            "GRANT SELECT ON blocks, transactions, logs, erc20_transfers, withdrawals, "
            "nft_transfers, traces, contracts, chain TO blockx_sql_bench"
        )
    finally:
        await conn.close()
    user = url.split("://", 1)[1].split("@", 1)[0]
    return url.replace(f"://{user}@", "://blockx_sql_bench@", 1)


async def measure(
    port: int, args: list[Any], rounds: int, proc: subprocess.Popen[bytes]
) -> dict[str, Any]:
    channel = Channel("127.0.0.1", port)
    try:
        await wait_serving(channel, proc, args)
        times: dict[str, list[float]] = {"sql_totals": [], "python_totals": []}
        answers: dict[str, Any] = {}
        for _ in range(rounds):
            for function in times:
                seconds, answers[function] = await invoke(channel, function, args)
                times[function].append(seconds)
    finally:
        channel.close()
    check_same(answers["sql_totals"], answers["python_totals"])
    sql_ms = statistics.median(times["sql_totals"]) * 1000
    python_ms = statistics.median(times["python_totals"]) * 1000
    return {
        "transfers": sum(count for count, _ in answers["python_totals"].values()),
        "tokens_found": len(answers["python_totals"]),
        "sql_ms": round(sql_ms, 2),
        "python_ms": round(python_ms, 2),
        "speedup": round(python_ms / sql_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--transfers", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--postgres-url", default="", help="a superuser's URL of an empty db")
    args = parser.parse_args()
    with Anvil() as node, tempfile.TemporaryDirectory() as tmp:
        last = asyncio.run(mine(node.url, args.blocks, args.tokens, args.transfers))
        db = args.postgres_url or f"sqlite:///{tmp}/chain.db"
        ingest(node.url, db, last)
        engine = "postgresql" if args.postgres_url else "sqlite"
        extra = {}
        if args.postgres_url:
            extra["BLOCKDB_EXECUTOR_URL"] = asyncio.run(read_only_role(db))
        functions = Path(tmp) / "functions"
        functions.mkdir()
        (functions / "sums.py").write_text(FUNCTIONS)
        port = free_port()
        env = {
            **os.environ,
            "SYNC_INVOKER_LISTEN": f"127.0.0.1:{port}",
            "FUNCTIONS_DIR": str(functions),
            "BLOCKDB_URL": db,
            **extra,
            "EXECUTOR_COUNT": "1",
            "IO_CACHE_MAX_BYTES": "0",
            "CALL_DEADLINE_MS": "60000",
            "MAX_INVOKE_TIMEOUT_MS": "60000",
            "BLOCKX_LOG_LEVEL": "WARNING",
        }
        log = (Path(tmp) / "invoker.log").open("wb")
        proc = subprocess.Popen(
            [_program("blockx-syncinvoker")], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            low = last - args.blocks + 1
            total = "sum(value)" if args.postgres_url else "sum(CAST(value AS REAL))"
            result = asyncio.run(measure(port, [low, last, total], args.rounds, proc))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    print(json.dumps({"blocks": args.blocks, "engine": engine, **result}), flush=True)


if __name__ == "__main__":
    main()
