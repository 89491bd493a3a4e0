"""Selective log ingest against cryo: one token's Transfer logs over 10,000 blocks of
one anvil, wall time and blocks/s of each, and their ratio (goal: >= 1.0).

Run: uv run python bench/selective_logs_bench.py [--blocks 10000] [--tokens 5]
     [--transfers 2] [--rounds 3] [--cryo-python /work/wt/cryo-venv/bin/python]
     [--tuned "--log-range 50000"]

Prints one JSON line. The chain: ``--blocks`` blocks (plus the devnet's two set-up
blocks), each holding ``--transfers`` ERC-20 transfers of tokens drawn among
``--tokens`` (so the first token's Transfer logs fall in some blocks, not all).

* ``blockx``: the documented command as a user runs it, in a child process, wall
  time from its start to its exit (Python's start-up included), into a fresh SQLite
  file: ``blockx chain ingest --rpc URL --db sqlite:///... --logs --address TOKEN
  --topic0 TRANSFER --from 0 --to N-1 --json``;
* ``cryo``: ``cryo.freeze(["logs"], rpc=URL, blocks=["0:N"], contract=[TOKEN],
  topic0=[TRANSFER], output_dir=D)`` with cryo's defaults, in a child process of the
  venv given by ``--cryo-python`` (cryo is no dependency of BlockX: ``pip install
  cryo==0.3.2 pyarrow polars`` into a venv of its own), wall time likewise; the
  child ends with ``os._exit(0)`` after ``freeze`` (cryo may crash while the
  interpreter shuts down) and counts the rows of the parquet files it wrote;
* ``--tuned ARGS``: the blockx command again with these flags added, reported
  apart.

Both must find the same number of logs, or the run fails. Each figure is the
median of ``--rounds`` rounds, the kinds interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.schema import TRANSFER_TOPIC

# Run by the cryo venv's interpreter: argv = url, first, stop, token, topic0, dir.
CRYO_CHILD = """
import os, sys, glob
import cryo
url, first, stop, token, topic0, out = sys.argv[1:]
cryo.freeze(["logs"], rpc=url, blocks=[f"{first}:{stop}"], contract=[token],
            topic0=[topic0], output_dir=out, no_verbose=True)
import pyarrow.parquet as pq
rows = sum(pq.read_metadata(f).num_rows for f in glob.glob(os.path.join(out, "*.parquet")))
print(rows, flush=True)
os._exit(0)
"""


async def mine(url: str, blocks: int, tokens: int, transfers: int) -> tuple[str, int]:
    async with JsonRpcClient(url) as client:
        net = Devnet(client)
        await net.setup(tokens=tokens)
        await net.mine(blocks, token_transfers=transfers, eth_transfers=0)
        return net.tokens[0].address.lower(), len(net.tokens)


def run_blockx(url: str, token: str, last: int, extra: list[str]) -> tuple[float, int]:
    blockx = shutil.which("blockx") or str(Path(sys.executable).with_name("blockx"))
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            blockx,
            *("chain", "ingest", "--rpc", url, "--db", f"sqlite:///{tmp}/logs.db"),
            *("--logs", "--address", token, "--topic0", TRANSFER_TOPIC),
            *("--from", "0", "--to", str(last), "--json", *extra),
        ]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"blockx failed ({done.returncode}): {done.stderr or done.stdout}")
    return seconds, int(json.loads(done.stdout)["logs"])


def run_cryo(python: str, url: str, token: str, stop: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        command = [python, "-c", CRYO_CHILD, url, "0", str(stop), token, TRANSFER_TOPIC, tmp]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"cryo failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, int(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=5)
    parser.add_argument("--transfers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cryo-python", default="/work/wt/cryo-venv/bin/python")
    parser.add_argument("--tuned", default="", help="blockx flags to measure apart")
    args = parser.parse_args()
    with Anvil() as node:
        token, _ = asyncio.run(mine(node.url, args.blocks, args.tokens, args.transfers))
        last = args.blocks - 1  # blocks 0 .. blocks - 1
        kinds: dict[str, list[float]] = {"blockx": [], "cryo": []}
        if args.tuned:
            kinds["tuned"] = []
        found: dict[str, int] = {}
        for _ in range(args.rounds):
            for kind in kinds:
                if kind == "cryo":
                    seconds, logs = run_cryo(args.cryo_python, node.url, token, last + 1)
                else:
                    extra = shlex.split(args.tuned) if kind == "tuned" else []
                    seconds, logs = run_blockx(node.url, token, last, extra)
                kinds[kind].append(seconds)
                found[kind] = logs
        if len(set(found.values())) != 1:
            raise SystemExit(f"the logs found differ: {found}")
    blocks = last + 1
    result: dict[str, Any] = {
        "blocks": blocks,
        "logs": found["blockx"],
        "tokens": args.tokens,
        "transfers_per_block": args.transfers,
    }
    for kind, times in kinds.items():
        median = statistics.median(times)
        result[kind] = {
            "seconds": round(median, 3),
            "blocks_per_s": round(blocks / median),
            "rounds": [round(t, 3) for t in times],
        }
    result["ratio"] = round(result["blockx"]["blocks_per_s"] / result["cryo"]["blocks_per_s"], 2)
    if args.tuned:
        result["tuned"]["flags"] = args.tuned
        result["tuned_ratio"] = round(
            result["tuned"]["blocks_per_s"] / result["cryo"]["blocks_per_s"], 2
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
