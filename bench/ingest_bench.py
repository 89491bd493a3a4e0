"""Ingest benchmark: ``blockx chain ingest`` as a user runs it against cryo, on the
same anvil and the same blocks, beside the raw ceiling of the node.

Run: uv run python bench/ingest_bench.py [--blocks 5000] [--rounds 3]
     [--cryo-python PATH] [--tuned "--batch-size 100"] [--in-process]
     [--postgres URL] [--traces]

cryo is no dependency of BlockX: make its venv once with
``python3 -m venv /tmp/cryo-venv && /tmp/cryo-venv/bin/pip install cryo==0.3.2
pyarrow polars`` and name its interpreter by ``--cryo-python`` or ``CRYO_PYTHON``
(default ``/tmp/cryo-venv/bin/python``); without it the cryo figures are skipped.

Prints one JSON line. One anvil holds ``--blocks`` blocks made by the devnet
generator (``blockx_chain.devnet``, its defaults: 8 ERC-20 and 4 ETH transfers a
block). Each round runs, in an order that turns from round to round so the
machine's drift hits all alike:

* ``blockx``: the documented command with its defaults, ``blockx chain ingest
  --rpc URL --db sqlite:///FRESH.db --json`` (``--json`` only shapes the summary),
  a child process, wall time from its start to its exit (the interpreter's
  start-up, the imports, the schema made in a new file, all included);
  ``blockx_own_s`` is the run's own clock from its summary;
* ``cryo``: ``cryo.freeze(["blocks", "transactions", "logs"], rpc=URL,
  blocks=["0:N"], output_dir=D)`` with cryo's defaults, parquet files, a child
  process of the cryo venv, wall time likewise (the child ends with
  ``os._exit(0)`` once ``freeze`` returns: cryo may crash while the interpreter
  shuts down); ``cryo_own_s`` is ``freeze`` alone. The rows cryo wrote are
  counted afterwards (another child) and must equal blockx's blocks,
  transactions and logs, or the run fails;
* ``raw``: the requests ingest sends (``eth_getBlockByNumber(n, true)`` and
  ``eth_getBlockReceipts(n)`` for every block, 50 blocks a JSON-RPC batch, 4
  batches in flight, through the same client) in this process, answers thrown
  away: what the node serves at most, the ceiling;
* ``--tuned ARGS``: the blockx command again with these flags added, reported
  apart (never as the default figure);
* ``--in-process``: ``blockx_chain.ingest.ingest`` called in this process
  (``sqlite``; with ``--postgres`` or a PostgreSQL of Debian's binaries,
  ``postgres``; with ``--traces``, the same with traces and a swap a block).

And once, after the rounds, start-up (goal: within 1.5 times a minimal Typer + rich
app): ``blockx chain ingest`` into the database already full (nothing left to
fetch: start-up, the node's first answers, the file opened, the lock, exit),
``blockx chain ingest --help``, and a two-command Typer + rich app's no-op command
on the same interpreter, best of five each.

Each figure is the median of ``--rounds`` rounds, and the best beside it; the ratios
are of medians. ``cpu_s`` is the CPU seconds anvil and the measured process spent
per round (median): on a small machine anvil's own CPU at the ceiling bounds what
ingest's work can add without slowing the node down.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.rpc import EthRpc, JsonRpcClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

BATCH_SIZE = 50  # ingest's defaults (plan.DEFAULT_BATCH_SIZE, run.DEFAULT_IN_FLIGHT)
IN_FLIGHT = 4

# Run by the cryo venv's interpreter: argv = url, stop, dir. Prints freeze's seconds.
CRYO_CHILD = """
import os, sys, time
import cryo
url, stop, out = sys.argv[1:]
started = time.perf_counter()
cryo.freeze(["blocks", "transactions", "logs"], rpc=url, blocks=[f"0:{stop}"],
            output_dir=out, no_verbose=True)
print(time.perf_counter() - started, flush=True)
os._exit(0)
"""
# Rows of the parquet files cryo wrote, per datatype: argv = dir.
CRYO_ROWS = """
import glob, json, os, sys
import pyarrow.parquet as pq
rows = {}
for kind in ("blocks", "transactions", "logs"):
    files = glob.glob(os.path.join(sys.argv[1], f"*__{kind}__*.parquet"))
    rows[kind] = sum(pq.read_metadata(f).num_rows for f in files)
print(json.dumps(rows))
os._exit(0)
"""
# The minimal app of goal 7: two commands, Typer and rich, a no-op.
TYPER_APP = """
import typer
from rich.console import Console

app = typer.Typer()


@app.command()
def noop() -> None:
    Console().print("", end="")


@app.command()
def other(name: str = "x") -> None:
    Console().print(name)


app()
"""


async def mine(url: str, blocks: int, swaps: int) -> int:
    async with JsonRpcClient(url) as client:
        net = Devnet(client)
        await net.setup(tokens=3)
        if swaps:
            await net.setup_pair()
        mined = await net.mine(blocks, swaps=swaps)
        return mined[-1].number


async def raw_ceiling(url: str, head: int) -> float:
    """Seconds to fetch blocks 0..head the way ingest does, answers discarded."""
    started = time.perf_counter()
    async with JsonRpcClient(url, max_batch=2 * BATCH_SIZE) as client:
        eth = EthRpc(client)

        async def fetch(numbers: list[int]) -> None:
            await asyncio.gather(
                eth.get_blocks(numbers, full=True), eth.get_block_receipts(numbers)
            )

        pending: deque[asyncio.Task[None]] = deque()
        for start in range(0, head + 1, BATCH_SIZE):
            numbers = list(range(start, min(start + BATCH_SIZE, head + 1)))
            if len(pending) >= IN_FLIGHT:
                await pending.popleft()
            pending.append(asyncio.create_task(fetch(numbers)))
        while pending:
            await pending.popleft()
    return time.perf_counter() - started


# An installed blockx has its bytecode cached (pip and uv write it, or the first run
# does); a PYTHONDONTWRITEBYTECODE of this shell would make every round compile the
# workspace's sources again, which no user pays.
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def blockx_command() -> str:
    """The ``blockx`` executable of this environment (``uv run`` puts it on PATH)."""
    return str(Path(sys.executable).with_name("blockx"))


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], what: str) -> tuple[float, str]:
    """Wall seconds of a child process run to its exit, and its output."""
    started = time.perf_counter()
    done = subprocess.run(command, env=USER_ENV, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}"
        )
    return seconds, done.stdout


def run_blockx(url: str, db: Path, extra: list[str]) -> tuple[float, dict[str, Any]]:
    command = [blockx_command(), "chain", "ingest", "--rpc", url, "--db", f"sqlite:///{db}"]
    seconds, out = timed([*command, "--json", *extra], "blockx chain ingest")
    return seconds, json.loads(out)


def run_cryo(python: str, url: str, stop: int, out: Path) -> tuple[float, float, dict[str, int]]:
    """Wall seconds, freeze's own seconds, and the rows written per datatype."""
    out.mkdir()
    seconds, printed = timed([python, "-c", CRYO_CHILD, url, str(stop), str(out)], "cryo")
    _, rows = timed([python, "-c", CRYO_ROWS, str(out)], "counting cryo's rows")
    return seconds, float(printed.split()[-1]), json.loads(rows)


def best_of(runs: int, command: list[str]) -> float:
    return min(timed(command, " ".join(command[:3]))[0] for _ in range(runs))


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
    """Wall seconds, the measured process's CPU seconds and anvil's, per kind."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.anvil: dict[str, list[float]] = {}

    def run(self, kind: str, work: Callable[[], float]) -> None:
        cpu, children, anvil = time.process_time(), children_cpu_s(), anvil_cpu_s()
        self.wall.setdefault(kind, []).append(work())
        spent = time.process_time() - cpu + children_cpu_s() - children
        self.cpu.setdefault(kind, []).append(spent)
        self.anvil.setdefault(kind, []).append(anvil_cpu_s() - anvil)


def in_process(url: str, db_url: str, traces: bool = False) -> float:
    from blockx_chain.ingest import IngestOptions, ingest
    from blockx_chain.url import parse_blockdb_url

    started = time.perf_counter()
    summary = asyncio.run(ingest(url, parse_blockdb_url(db_url), IngestOptions(traces=traces)))
    assert summary.reorgs == 0
    assert summary.traces > 0 or not traces
    return time.perf_counter() - started


def fresh_postgres_db(server_url: str) -> str:
    import asyncpg

    async def create() -> str:
        name = f"bench_{secrets.token_hex(4)}"
        conn = await asyncpg.connect(server_url)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return name

    name = asyncio.run(create())
    return f"{server_url.rpartition('/')[0]}/{name}"


def rounds(
    args: argparse.Namespace, url: str, head: int, postgres: str | None, folder: Path
) -> tuple[Measure, dict[str, Any]]:
    stop = head + 1
    measure = Measure()
    seen: dict[str, Any] = {}
    kinds: dict[str, Callable[[int], float]] = {}

    def blockx(extra: list[str], kind: str) -> Callable[[int], float]:
        def work(round_: int) -> float:
            seconds, summary = run_blockx(url, folder / f"{kind}{round_}.db", extra)
            seen.setdefault("blockx_own_s", []).append(summary["seconds"])
            seen[kind] = {k: summary[k] for k in ("blocks", "transactions", "logs")}
            return seconds

        return work

    kinds["blockx"] = blockx([], "blockx")
    if args.tuned:
        kinds["tuned"] = blockx(shlex.split(args.tuned), "tuned")
    if Path(args.cryo_python).is_file():

        def cryo(round_: int) -> float:
            seconds, own, rows = run_cryo(args.cryo_python, url, stop, folder / f"cryo{round_}")
            seen.setdefault("cryo_own_s", []).append(own)
            seen["cryo"] = rows
            return seconds

        kinds["cryo"] = cryo
    kinds["raw"] = lambda _: asyncio.run(raw_ceiling(url, head))
    if args.in_process:
        kinds["sqlite"] = lambda r: in_process(url, f"sqlite:///{folder}/in{r}.db")
        if args.traces:
            kinds["sqlite_traces"] = lambda r: in_process(url, f"sqlite:///{folder}/t{r}.db", True)
        if postgres is not None:
            kinds["postgres"] = lambda _: in_process(url, fresh_postgres_db(postgres))
            if args.traces:
                kinds["postgres_traces"] = lambda _: in_process(
                    url, fresh_postgres_db(postgres), True
                )
    names = list(kinds)
    for round_ in range(args.rounds):
        turn = round_ % len(names)
        for kind in names[turn:] + names[:turn]:
            measure.run(kind, functools.partial(kinds[kind], round_))
    for kind in ("tuned", "cryo"):
        if kind in seen and seen[kind] != seen["blockx"]:
            raise SystemExit(
                f"{kind} wrote other rows than blockx: {seen[kind]} vs {seen['blockx']}"
            )
    return measure, seen


def startup(url: str, full_db: Path, folder: Path) -> dict[str, float]:
    """Best-of-five seconds of the start-up figures (see the module's text)."""
    app = folder / "typer_app.py"
    app.write_text(TYPER_APP)
    ingest = [blockx_command(), "chain", "ingest", "--rpc", url, "--db", f"sqlite:///{full_db}"]
    figures = {
        "typer_app_noop_s": best_of(5, [sys.executable, str(app), "noop"]),
        "blockx_chain_ingest_help_s": best_of(5, [blockx_command(), "chain", "ingest", "--help"]),
        "blockx_chain_ingest_nothing_left_s": best_of(5, ingest),
    }
    return {name: round(value, 3) for name, value in figures.items()}


def report(
    args: argparse.Namespace, blocks: int, measure: Measure, seen: dict[str, Any]
) -> dict[str, Any]:
    median = {kind: statistics.median(values) for kind, values in measure.wall.items()}
    rate = {kind: blocks / value for kind, value in median.items()}
    result: dict[str, Any] = {
        "blocks": blocks,
        "rows": seen["blockx"],
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "blocks_per_s": {kind: round(value, 1) for kind, value in rate.items()},
        "best_blocks_per_s": {
            kind: round(blocks / min(values), 1) for kind, values in measure.wall.items()
        },
        "seconds": {kind: [round(v, 3) for v in values] for kind, values in measure.wall.items()},
        "blockx_own_s": statistics.median(seen["blockx_own_s"]),
        "blockx_vs_raw": round(rate["blockx"] / rate["raw"], 3),
        "cpu_s": {
            kind: {
                "anvil": round(statistics.median(measure.anvil[kind]), 3),
                "process": round(statistics.median(measure.cpu[kind]), 3),
            }
            for kind in measure.wall
        },
    }
    if "cryo" in rate:
        own = statistics.median(seen["cryo_own_s"])
        result["cryo_own_s"] = round(own, 3)
        # Goal: >= 1.0, wall time of each with its start-up.
        result["blockx_vs_cryo"] = round(rate["blockx"] / rate["cryo"], 3)
        result["blockx_vs_cryo_own_clocks"] = round(own / result["blockx_own_s"], 3)
        if "tuned" in rate:
            result["tuned"] = args.tuned
            result["tuned_vs_cryo"] = round(rate["tuned"] / rate["cryo"], 3)
    else:
        result["cryo"] = (
            f"skipped: no interpreter at {args.cryo_python} (python3 -m venv /tmp/cryo-venv && "
            "/tmp/cryo-venv/bin/pip install cryo==0.3.2 pyarrow polars)"
        )
    if "sqlite" in rate:
        result["sqlite_vs_raw"] = round(rate["sqlite"] / rate["raw"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cryo-python",
        default=os.environ.get("CRYO_PYTHON", "/tmp/cryo-venv/bin/python"),
        help="the interpreter of a venv with cryo==0.3.2, pyarrow and polars (CRYO_PYTHON)",
    )
    parser.add_argument("--tuned", default="", help="blockx flags to measure apart")
    parser.add_argument(
        "--in-process", action="store_true", help="also blockx_chain.ingest.ingest in this process"
    )
    parser.add_argument("--postgres", default=None, help="with --in-process: a server URL")
    parser.add_argument(
        "--traces", action="store_true", help="with --in-process: swaps, and ingest --traces too"
    )
    args = parser.parse_args()
    server: Any = None
    postgres = args.postgres
    if args.in_process and postgres is None:
        from postgres import PostgresServer, find_postgres_bin

        bin_dir = find_postgres_bin()
        if bin_dir is not None:
            server = PostgresServer(bin_dir)
            server.start()
            postgres = server.url()
    try:
        with Anvil() as node, tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
            folder = Path(tmp)
            head = asyncio.run(mine(node.url, args.blocks, 1 if args.traces else 0))
            measure, seen = rounds(args, node.url, head, postgres, folder)
            result = report(args, head + 1, measure, seen)
            result["startup"] = startup(node.url, folder / "blockx0.db", folder)
    finally:
        if server is not None:
            server.stop()
    start = result["startup"]
    result["startup"]["nothing_left_vs_typer_app"] = round(
        start["blockx_chain_ingest_nothing_left_s"] / start["typer_app_noop_s"], 2
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
