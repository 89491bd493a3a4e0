"""Head latency benchmark: a block mined by anvil → its rows committed in the sink
by ``blockx follow``, with push (newHeads, LISTEN/NOTIFY or the SQLite wake
sockets) against polling, measured in the same run.

Run: uv run python bench/head_latency_bench.py [--blocks 200] [--block-time 0.25]
     [--transfers 3] [--modes push,poll] [--rounds 1] [--probe-ms 5] [--warm-up 8]

Each mode gets a stack of its own, all on this host:

* anvil with ``--block-time`` (0.25: it mines a block every 250 ms by itself), three
  test tokens deployed first; ``--transfers`` ERC-20 transfers are sent after
  every block, so the next one holds them;
* etcd, a ``blockx-coordinator`` and a ``blockx-worker`` with ``BLOCKDB_URL`` and
  ``SINK_DB_URL`` on two separate SQLite files;
* the ingest follower, a process of its own, as a user runs it: ``blockx chain
  ingest --follow`` with its defaults (``push``: it subscribes to newHeads on
  anvil's WebSocket, derived from ``--rpc``; ``poll``: ``--ws none``, it polls the
  head every ``--poll-interval``, by default 0.25 s);
* ``blockx_drive.follow`` in this process with its defaults (``push``: woken by
  ingest's commits; ``poll``: ``push=False``, it polls every 0.1 s), running the
  example ``token_volume`` (``examples/functions``) over ``erc20_transfers`` with
  ``unit="block"`` into a sink table through ``BlockWriteResultHandler``.

Modes alternate, ``--rounds`` times; the figures of each are printed, then the
median of its rounds' p50s and p99s.

Every instant is read from the host's wall clock (``time.time_ns``; one clock for
every process of the host). Per block:

* ``mined``: when this benchmark's own newHeads subscription (on anvil's WebSocket,
  a connection of its own) announced it: anvil pushes right after sealing, so
  this is late by a loopback hop;
* ``ingested``: when a probe thread (reading the block database every
  ``--probe-ms``) first saw the block in ``blocks``: ingest's commit;
* ``seen``: when follow first saw the block in the block database (the event's
  ``seen_lag_ms`` subtracted from the instant it arrived);
* ``task``: the ledger's ``written_at_ms``, stamped by the task's writer when it
  builds its sink request (after the function ran, before the sink commits);
* ``committed``: when the probe thread first saw the block in the sink's
  ``_blockx_written`` ledger (the rows and the ledger entry commit together);
* ``reported``: when follow yielded the block's BlockWritten event.

The probe adds up to ``--probe-ms`` to ``ingested`` and ``committed``. Prints a
table of p50 / p90 / p99 / max per stage and end to end, the parameters, then one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import msgspec
from chain_cluster import ChainCluster
from websockets.asyncio.client import connect

from blockx_chain.contracts import deploy_data, transfer_data
from blockx_chain.devnet import Anvil
from blockx_chain.devnet.anvil import AnvilOptions
from blockx_chain.ingest.plan import DEFAULT_POLL_INTERVAL_S as INGEST_POLL_S
from blockx_chain.rpc import JsonRpcClient, parse_quantity, quantity
from blockx_core.registry import RegistryKind
from blockx_drive import DEFAULT_POLL_INTERVAL_S as FOLLOW_POLL_S
from blockx_drive import (
    DEFAULT_TASKS_IN_FLIGHT,
    BlockFailed,
    BlockRetrying,
    BlockWritten,
    JobSpec,
    follow,
)
from blockx_server.etcd.local import EtcdServer

SINK_TABLE = "token_volume"
TOKEN_TRANSFER_GAS = 100_000

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "functions"
COLUMNS = {"token": "TEXT", "transfers": "INTEGER", "volume": "NUMERIC", "senders": "INTEGER"}


def now_ms() -> float:
    return time.time_ns() / 1e6


class Probe(threading.Thread):
    """Reads the block database's newest block and the sink's ledger every
    ``interval_s`` on read-only connections (both are WAL: readers never block the
    writers), and records when each block first showed up in each."""

    def __init__(self, chain_db: Path, sink_db: Path, first: int, interval_s: float) -> None:
        super().__init__(name="probe", daemon=True)
        self._first = first  # the first block follow writes
        self._chain_db = chain_db
        self._sink_db = sink_db
        self._interval_s = interval_s
        self._halt = threading.Event()
        self.ingested_ms: dict[int, float] = {}
        self.committed_ms: dict[int, float] = {}

    def halt(self) -> None:
        self._halt.set()
        self.join()

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection | None:
        try:
            return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        except sqlite3.OperationalError:
            return None  # not created yet

    def run(self) -> None:
        chain = sink = None
        top_ingested = -1
        # Blocks commit out of order (several tasks in flight): read the ledger from
        # the lowest block not seen there yet.
        low_committed = self._first
        while not self._halt.is_set():
            chain = chain or self._open(self._chain_db)
            sink = sink or self._open(self._sink_db)
            with contextlib.suppress(sqlite3.OperationalError):
                if chain is not None:
                    (top,) = chain.execute("SELECT MAX(block_number) FROM blocks").fetchone()
                    if top is not None and top > top_ingested:
                        at = now_ms()
                        for number in range(top_ingested + 1, top + 1):
                            self.ingested_ms.setdefault(number, at)
                        top_ingested = top
            with contextlib.suppress(sqlite3.OperationalError):  # no ledger before a write
                if sink is not None:
                    rows = sink.execute(
                        "SELECT block_number FROM _blockx_written "
                        "WHERE table_name = ? AND block_number >= ?",
                        (SINK_TABLE, low_committed),
                    ).fetchall()
                    at = now_ms()
                    for (number,) in rows:
                        self.committed_ms.setdefault(number, at)
                    while low_committed in self.committed_ms:
                        low_committed += 1
            self._halt.wait(self._interval_s)
        for conn in (chain, sink):
            if conn is not None:
                conn.close()


@dataclass
class Timeline:
    """Per block number, the instants (wall clock ms) of each stage."""

    mined: dict[int, float] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    reported: dict[int, float] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def has(self, number: int) -> Callable[[], bool]:
        """Whether follow reported ``number`` written, as a condition to wait for."""
        return lambda: number in self.reported


class Chain:
    """The benchmark's side of anvil: tokens deployed, transfers sent after every
    block, and the instant each block was announced on its own newHeads
    subscription."""

    def __init__(self, rpc: JsonRpcClient, ws_url: str, transfers: int) -> None:
        self._rpc = rpc
        self._ws_url = ws_url
        self._transfers = transfers
        self._turn = 0
        self.accounts: list[str] = []
        self.tokens: list[str] = []
        self.mined: dict[int, float] = {}
        self.head = -1

    async def deploy(self) -> None:
        self.accounts = [str(a) for a in await self._rpc.request("eth_accounts")]
        owner = self.accounts[0]
        sent = await self._rpc.batch(
            [
                (
                    "eth_sendTransaction",
                    [
                        {
                            "from": owner,
                            "gas": quantity(2_000_000),
                            "data": deploy_data(f"Test Token {i}", f"TT{i}", 10**27),
                        }
                    ],
                )
                for i in range(3)
            ]
        )
        for tx in sent:
            receipt = None
            while receipt is None:
                await asyncio.sleep(0.05)
                receipt = await self._rpc.request("eth_getTransactionReceipt", [tx])
            assert receipt["status"] == "0x1", receipt
            self.tokens.append(str(receipt["contractAddress"]))

    def _transactions(self) -> list[tuple[str, list[Any]]]:
        txs = []
        for _ in range(self._transfers):
            self._turn += 1
            receiver = self.accounts[1 + self._turn % (len(self.accounts) - 1)]
            token = self.tokens[self._turn % len(self.tokens)]
            data = transfer_data(receiver, 10**15 + self._turn)
            tx = {
                "from": self.accounts[0],
                "to": token,
                "gas": quantity(TOKEN_TRANSFER_GAS),
                "data": data,
            }
            txs.append(("eth_sendTransaction", [tx]))
        return txs

    async def watch(self, stop: asyncio.Event) -> None:
        """Stamp every block as its newHeads message arrives, and send the next
        block's transfers."""
        subscribe = {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]}
        async with connect(self._ws_url, compression=None) as ws:
            await ws.send(json.dumps(subscribe))
            await ws.recv()
            while not stop.is_set():
                message = msgspec.json.decode(await ws.recv(decode=False))
                at = now_ms()
                number = parse_quantity(message["params"]["result"]["number"])
                self.mined.setdefault(number, at)
                self.head = max(self.head, number)
                if self.tokens:
                    await self._rpc.batch(self._transactions())


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


STAGES: tuple[tuple[str, str, str], ...] = (
    # (label, from, to)
    ("mined → ingested", "mined", "ingested"),
    ("ingested → seen by follow", "ingested", "seen"),
    ("seen → task's writer", "seen", "task"),
    ("task's writer → committed", "task", "committed"),
    ("committed → follow event", "committed", "reported"),
    ("mined → committed", "mined", "committed"),
    ("mined → follow event", "mined", "reported"),
)
END_TO_END = "mined → committed"


def summarize(instants: dict[str, dict[int, float]], measured: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, start, end in STAGES:
        values = [
            instants[end][n] - instants[start][n]
            for n in measured
            if n in instants[start] and n in instants[end]
        ]
        if not values:
            continue
        out[label] = {
            "count": len(values),
            "p50_ms": round(pct(values, 0.50), 1),
            "p90_ms": round(pct(values, 0.90), 1),
            "p99_ms": round(pct(values, 0.99), 1),
            "max_ms": round(max(values), 1),
            "mean_ms": round(sum(values) / len(values), 1),
        }
    return out


def print_table(stats: dict[str, Any]) -> None:
    header = f"{'stage':<28}{'n':>6}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'max ms':>10}"
    print(header)
    print("-" * len(header))
    for label, s in stats.items():
        print(
            f"{label:<28}{s['count']:>6}{s['p50_ms']:>10.1f}{s['p90_ms']:>10.1f}"
            f"{s['p99_ms']:>10.1f}{s['max_ms']:>10.1f}"
        )
        if label == "committed → follow event":
            print("-" * len(header))


def ingest_command(mode: str, rpc_url: str, chain_url: str) -> list[str]:
    blockx = shutil.which("blockx")
    assert blockx is not None, "blockx is not installed (uv sync)"
    ws = ["--ws", "none"] if mode == "poll" else []
    return [blockx, "chain", "ingest", "--rpc", rpc_url, "--db", chain_url, "--follow", *ws]


async def wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def run(args: argparse.Namespace, mode: str, root: Path) -> dict[str, Any]:
    chain_db, sink_db = root / "chain.db", root / "sink.db"
    chain_url, sink_url = f"sqlite:///{chain_db}", f"sqlite:///{sink_db}"
    ingest_log = (root / "ingest.log").open("wb")
    timeline = Timeline()
    anvil = Anvil(AnvilOptions(block_time_s=args.block_time))
    anvil.start()
    stop = asyncio.Event()
    async with EtcdServer() as etcd, JsonRpcClient(anvil.url) as rpc:
        chain = Chain(rpc, anvil.url.replace("http://", "ws://"), args.transfers)
        watcher = asyncio.create_task(chain.watch(stop))
        await chain.deploy()
        await wait_for("a block", lambda: chain.head >= 0, 10)
        probe = Probe(chain_db, sink_db, 0, args.probe_ms / 1000)
        feeder = await asyncio.create_subprocess_exec(
            *ingest_command(mode, anvil.url, chain_url),
            stdout=ingest_log,
            stderr=subprocess.STDOUT,
        )
        cluster = ChainCluster(
            etcd,
            root,
            RegistryKind.BLOCK,
            chain_url=chain_url,
            sink_url=sink_url,
            functions=EXAMPLES,
            EXECUTOR_COUNT="2",
            BLOCKX_LOG_LEVEL="WARNING",
        )
        probe.start()
        try:
            await cluster.wait_ready()
            start = chain.head + 1
            await wait_for("ingest", lambda: start in probe.ingested_ms, 60)
            async with cluster.client() as client:

                async def collect() -> None:
                    async for event in follow(
                        client,
                        JobSpec(
                            function="token_volume",
                            source_table="erc20_transfers",
                            unit="block",
                            sink_table=SINK_TABLE,
                            db_url=chain_url,
                            sink_db_url=sink_url,
                            writer_config={"columns": COLUMNS},
                        ),
                        from_block=start,
                        stop=stop,
                        push=mode == "push",
                    ):
                        at = now_ms()
                        match event:
                            case BlockWritten():
                                timeline.reported.setdefault(event.number, at)
                                timeline.seen.setdefault(event.number, at - event.seen_lag_ms)
                                timeline.rows[event.number] = event.rows
                            case BlockRetrying() | BlockFailed():
                                timeline.problems.append(f"{event}")
                            case _:
                                pass

                follower = asyncio.create_task(collect())
                first = start + args.warm_up
                last = first + args.blocks - 1
                await wait_for(
                    "every block in the sink",
                    lambda: last in timeline.reported and last in probe.committed_ms,
                    args.blocks * args.block_time + 120,
                )
                stop.set()
                await asyncio.wait_for(follower, 30)
        finally:
            stop.set()
            probe.halt()
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            feeder.send_signal(signal.SIGTERM)
            try:
                ingest_exit = await asyncio.wait_for(feeder.wait(), 30)
            except TimeoutError:
                feeder.kill()
                ingest_exit = await feeder.wait()
            ingest_log.close()
            cluster.stop()
            anvil.stop()
    measured = list(range(first, last + 1))
    instants = {
        "mined": chain.mined,
        "ingested": probe.ingested_ms,
        "seen": timeline.seen,
        "task": read_stamps(sink_db),
        "committed": probe.committed_ms,
        "reported": timeline.reported,
    }
    missing = [n for n in measured if n not in timeline.reported]
    return {
        "mode": mode,
        "stats": summarize(instants, measured),
        "rows": sum(timeline.rows.get(n, 0) for n in measured),
        "missing": missing,
        "problems": timeline.problems,
        "ingest_exit": ingest_exit,
        "ingest_log_tail": (root / "ingest.log").read_text(errors="replace")[-400:],
        "worker_traceback": "Traceback" in cluster.worker.output(),
    }


def read_stamps(sink_db: Path) -> dict[int, float]:
    conn = sqlite3.connect(f"file:{sink_db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT block_number, written_at_ms FROM _blockx_written WHERE table_name = ?",
            (SINK_TABLE,),
        ).fetchall()
    finally:
        conn.close()
    return {number: float(at) for number, at in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200, help="blocks measured per run")
    parser.add_argument(
        "--block-time", type=float, default=0.25, help="anvil --block-time (seconds)"
    )
    parser.add_argument("--transfers", type=int, default=3, help="ERC-20 transfers per block")
    parser.add_argument("--modes", default="push,poll", help="push, poll or both, in turn")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each mode, alternating")
    parser.add_argument("--probe-ms", type=float, default=5, help="the probe's read interval")
    parser.add_argument(
        "--warm-up", type=int, default=8, help="blocks followed first, not measured"
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.blocks < 1 or args.block_time <= 0 or args.transfers < 1 or args.rounds < 1:
        parser.error("--blocks, --transfers and --rounds must be >= 1, --block-time > 0")
    if not modes or any(m not in ("push", "poll") for m in modes):
        parser.error("--modes is push, poll or push,poll")
    params = {
        "blocks": args.blocks,
        "block_time_s": args.block_time,
        "transfers_per_block": args.transfers,
        "ingest_poll_ms": INGEST_POLL_S * 1000,
        "follow_poll_ms": FOLLOW_POLL_S * 1000,
        "follow_tasks_in_flight": DEFAULT_TASKS_IN_FLIGHT,
        "executors": 2,
        "probe_ms": args.probe_ms,
        "warm_up": args.warm_up,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
    }
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()))
    results: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for mode in modes:
            root = Path(tempfile.mkdtemp(prefix=f"head-latency-{mode}-"))
            try:
                result = asyncio.run(run(args, mode, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            results.append(result)
            print(f"\n== {mode} ==")
            print_table(result["stats"])
            print(
                f"{result['rows']} sink rows; missing {len(result['missing'])}; "
                f"retries/failures {len(result['problems'])}; ingest exit {result['ingest_exit']}"
            )
    summary: dict[str, Any] = {}
    for mode in modes:
        ends = [r["stats"][END_TO_END] for r in results if r["mode"] == mode]
        summary[mode] = {
            q: statistics.median(e[f"{q}_ms"] for e in ends) for q in ("p50", "p90", "p99", "max")
        }
    print("\nmined → committed, median over rounds (goal: p50 <= 50 ms, p99 <= 200 ms):")
    for mode, figures in summary.items():
        met = figures["p50"] <= 50 and figures["p99"] <= 200
        print(
            f"  {mode:<5} p50 {figures['p50']:.1f}  p90 {figures['p90']:.1f}  "
            f"p99 {figures['p99']:.1f}  max {figures['max']:.1f} ms  "
            f"({'met' if met else 'not met'})"
        )
    for result in results:
        result.pop("ingest_log_tail")
    print(
        json.dumps({"bench": "head_latency", "params": params, "summary": summary, "runs": results})
    )


if __name__ == "__main__":
    main()
