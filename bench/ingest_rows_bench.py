"""Where ingest's own CPU goes per block, without the node in the loop.

Run: uv run python bench/ingest_rows_bench.py [--blocks 2000] [--rounds 5]

An anvil holds ``--blocks`` blocks of the devnet generator (its defaults: 8 ERC-20
and 4 ETH transfers a block); their answers to ingest's two requests
(``eth_getBlockByNumber(n, true)`` and ``eth_getBlockReceipts(n)``, 50 blocks a
batch) are fetched once and kept as the bytes the node sent. Then, ``--rounds``
times, each phase of ingest's per-row work runs over all of them, timed by this
process's CPU clock:

* ``decode``: the JSON bytes to Python objects (``msgspec.json``, as the client);
* ``answers``: each block and its receipts checked against the request
  (``check_block``, ``check_receipts``);
* ``rows``: the rows of each block (``ingest.rows.block_rows``);
* ``cells``: every cell checked against the schema and the derived tables made
  (``schema.block_row_sets``);
* ``sqlite``: the row sets inserted into a fresh SQLite block database, 50 blocks
  a transaction, as ingest writes them.

Prints the best round of each phase in milliseconds and per block, and one JSON
line. Figures are for comparing two versions of the code on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest.rows import block_rows
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.rpc.answers import ByNumber, check_block, check_receipts
from blockx_chain.schema import BLOCK_TABLES, MIGRATIONS, Engine, block_row_sets

BATCH = 50

Answers = list[tuple[list[int], bytes, bytes]]


async def fetch(blocks: int) -> Answers:
    """The node's answers, as bytes, for every block the devnet mined."""
    with Anvil() as node:
        async with JsonRpcClient(node.url) as client:
            net = Devnet(client)
            await net.setup(tokens=3)
            head = (await net.mine(blocks))[-1].number
        saved: Answers = []
        for start in range(0, head + 1, BATCH):
            numbers = list(range(start, min(start + BATCH, head + 1)))
            bodies = []
            for method, extra in (("eth_getBlockByNumber", [True]), ("eth_getBlockReceipts", [])):
                batch = [
                    {"jsonrpc": "2.0", "id": i, "method": method, "params": [hex(n), *extra]}
                    for i, n in enumerate(numbers)
                ]
                bodies.append(await asyncio.to_thread(_post, node.url, msgspec.json.encode(batch)))
            saved.append((numbers, bodies[0], bodies[1]))
    return saved


def _post(url: str, body: bytes) -> bytes:
    request = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        data: bytes = answer.read()
        return data


def _timed(work: Callable[[], Any]) -> tuple[float, Any]:
    started = time.process_time()
    result = work()
    return time.process_time() - started, result


def one_round(saved: Answers, folder: Path, round_: int) -> dict[str, float]:
    decoder = msgspec.json.Decoder()
    seconds: dict[str, float] = {}
    seconds["decode"], decoded = _timed(
        lambda: [(n, decoder.decode(b), decoder.decode(r)) for n, b, r in saved]
    )

    def answers() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        checked = []
        for numbers, blocks, receipts in decoded:
            for number, block, receipt in zip(numbers, blocks, receipts, strict=True):
                what = f"eth_getBlockByNumber({hex(number)}, true)"
                checked.append(
                    (
                        check_block(block["result"], ByNumber(number), what, full=True),
                        check_receipts(
                            receipt["result"], f"receipts of block {number}", number=number
                        ),
                    )
                )
        return checked

    seconds["answers"], checked = _timed(answers)
    seconds["rows"], rows = _timed(lambda: [block_rows(b, r) for b, r in checked])
    seconds["cells"], sets = _timed(
        lambda: [block_row_sets(rows[i : i + BATCH]) for i in range(0, len(rows), BATCH)]
    )
    seconds["sqlite"], _ = _timed(lambda: insert(folder / f"blocks-{round_}.db", sets))
    return seconds


def insert(path: Path, sets: list[dict[str, list[tuple[Any, ...]]]]) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        for migrate in MIGRATIONS:
            for statement in migrate(Engine.SQLITE):
                db.execute(statement)
        inserts = {
            t.name: f"INSERT INTO {t.name} ({', '.join(t.names)}) "
            f"VALUES ({', '.join('?' * len(t.names))})"
            for t in BLOCK_TABLES
        }
        for row_sets in sets:
            db.execute("BEGIN IMMEDIATE")
            for name, values in row_sets.items():
                if values:
                    db.executemany(inserts[name], values)
            db.execute("COMMIT")
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    saved = asyncio.run(fetch(args.blocks))
    blocks = sum(len(numbers) for numbers, _, _ in saved)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ingest-rows-bench-") as tmp:
        for round_ in range(args.rounds):
            for phase, seconds in one_round(saved, Path(tmp), round_).items():
                best[phase] = min(best.get(phase, seconds), seconds)
    total = sum(best.values())
    print(f"{blocks:,} blocks; best of {args.rounds} rounds, CPU")
    for phase, seconds in [*best.items(), ("total", total)]:
        print(f"  {phase:<8} {seconds * 1000:8.1f} ms  {seconds * 1e6 / blocks:7.1f} us/block")
    figures = {phase: round(seconds * 1000, 1) for phase, seconds in best.items()}
    print(json.dumps({"blocks": blocks, "rounds": args.rounds, "best_ms": figures}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
