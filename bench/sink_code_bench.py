"""What keeping the code costs a sink write: block writes with and without the
task's code (``code_digest``, ``code_sources``).

Run: uv run python bench/sink_code_bench.py [--writes 1000] [--blocks 1]
[--rows 100] [--rounds 3] [--postgres-url postgresql://...]

Prints one JSON line per engine (a SQLite file in a temporary directory, and the
PostgreSQL database given). Each run writes ``--writes`` tasks of ``--blocks``
blocks of ``--rows`` rows each into a fresh table (``fresh``: nothing
replaced), then rewrites every block with other tasks (``rewrite``: each write
replaces its block's last entry of a task, which removes that task's code row);
with code, one module set (``examples/functions``) for the first pass and
another for the rewrite, so the rewrite's last write leaves the first set
unused and removed. The passes with and without code take turns for
``--rounds`` rounds; reports the median writes/s of each and their ratio
(1.0: keeping the code costs nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.url import parse_blockdb_url

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "functions"


def _module_set(extra: str) -> tuple[str, dict[str, str]]:
    sources = {path.stem: path.read_text() for path in sorted(EXAMPLES.glob("*.py"))}
    sources["bench_extra"] = extra
    digest = hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()
    return digest, sources


async def _pass(
    sink: SinkStore, table: str, shape: tuple[int, int, int], prefix: str, code: Any
) -> float:
    writes, blocks, rows = shape
    started = time.perf_counter()
    for n in range(writes):
        extra: dict[str, Any] = {}
        if code is not None:
            extra = {"code_digest": code[0], "code_sources": code[1]}
        await sink.replace_blocks(
            table,
            1,
            [
                (b, f"0x{b:x}{prefix}", [{"v": i, "w": f"r{i}"} for i in range(rows)])
                for b in range(n * blocks, (n + 1) * blocks)
            ],
            code_epoch=1,
            task_id=f"{prefix}-{n}",
            now_ms=n,
            **extra,
        )
    return writes / (time.perf_counter() - started)


async def _engine(url: str, shape: tuple[int, int, int], rounds: int) -> dict[str, Any]:
    sink = await open_sink(parse_blockdb_url(url))
    passes: dict[str, list[float]] = {}
    try:
        # With and without code in turns, each round on fresh tables: a machine
        # busy with something else slows both alike.
        for round_ in range(rounds):
            for coded in (False, True):
                name = "with_code" if coded else "without_code"
                table = f"{name}_{round_}"
                first = _module_set(f"A = {round_}\n") if coded else None
                second = _module_set(f"B = {round_}\n") if coded else None
                for phase, prefix, code in (("fresh", "a", first), ("rewrite", "b", second)):
                    rate = await _pass(sink, table, shape, f"{prefix}{round_}", code)
                    passes.setdefault(f"{name}_{phase}", []).append(rate)
        async with sink.transaction() as tx:
            kept = await tx.fetch("SELECT count(*) AS n FROM _blockx_code", ())
    finally:
        await sink.close()
    writes, blocks, rows = shape
    shown: dict[str, Any] = {"engine": url.split(":", 1)[0], "writes": writes}
    shown.update(blocks_per_write=blocks, rows_per_block=rows)
    medians = {key: statistics.median(rates) for key, rates in passes.items()}
    shown.update({f"{key}_writes_per_s": round(rate) for key, rate in medians.items()})
    for phase in ("fresh", "rewrite"):
        ratio = medians[f"with_code_{phase}"] / medians[f"without_code_{phase}"]
        shown[f"{phase}_ratio"] = round(ratio, 3)
    # Each round's last rewrite left its first module set unused: one set per round.
    shown["code_rows_kept"] = int(kept[0]["n"])
    return shown


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=1, help="blocks per write")
    parser.add_argument("--rows", type=int, default=100, help="rows per block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        urls = [f"sqlite:///{scratch}/sink.db"]
        if args.postgres_url:
            urls.append(args.postgres_url)
        for url in urls:
            print(
                json.dumps(await _engine(url, (args.writes, args.blocks, args.rows), args.rounds))
            )


if __name__ == "__main__":
    asyncio.run(main())
