"""Head latency benchmark: a block mined on anvil → its rows committed in the sink
by ``blockx follow``.

Run: uv run python bench/head_latency_bench.py [--blocks 200] [--interval-ms 250]
     [--transfers 3] [--ingest-poll-ms 250] [--follow-poll-ms 100]
     [--probe-ms 5] [--warm-up 5]

The stack, all on this host:

* anvil with ``--no-mining`` (no automine, no interval mining: a block exists only
  when this benchmark sends ``evm_mine``), three test tokens;
* etcd, a ``blockx-coordinator`` and a ``blockx-worker`` (2 executors) with
  ``BLOCKDB_URL`` and ``SINK_DB_URL`` on two separate SQLite files;
* the ingest follower, a process of its own, as a user runs it: ``blockx chain
  ingest --follow --poll-interval`` (``--ingest-poll-ms``; by default the CLI's
  default);
* ``blockx_drive.follow`` in this process (``poll_interval_s`` =
  ``--follow-poll-ms``, by default ``blockx follow``'s default), running the
  example ``token_volume`` (``examples/functions``) over ``erc20_transfers`` with
  ``unit="block"`` (one sink row per token per block) into a sink table through
  ``BlockWriteResultHandler``.

Then ``--blocks`` blocks are mined, one every ``--interval-ms`` (scheduled on a
fixed grid, so a slow block does not shift the ones after it), each holding
``--transfers`` ERC-20 transfers, after ``--warm-up`` blocks that are not measured.

Every instant is read from the host's wall clock (``time.time_ns``): the
Worker's writer stamps ``written_at_ms`` and follow its ``seen_lag_ms`` from the
same clock, and CLOCK_REALTIME is one clock for every process of the host, so
figures taken in different processes compare directly (only a clock step during
the minute of a run would skew them). Per block:

* ``mined``: when ``evm_mine`` returned (the block was sealed before the reply,
  so this is late by at most one loopback round trip; the transactions were
  sent before);
* ``ingested``: when a probe thread (reading the block database every
  ``--probe-ms``) first saw the block in ``blocks``: ingest's commit;
* ``seen``: when follow first saw the block in the block database (the event's
  ``seen_lag_ms`` subtracted from the instant it arrived);
* ``stamped``: the ledger's ``written_at_ms``, taken by the writer when it
  builds its sink request, after its canonical check and before the IO
  subsystem runs the transaction (a lower bound of the commit, truncated to
  the ms);
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
from chain_cluster import ChainCluster

from blockx_chain.contracts import transfer_data
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest.plan import DEFAULT_POLL_INTERVAL_S as INGEST_POLL_S
from blockx_chain.rpc import JsonRpcClient, quantity
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


class Miner:
    """Mines blocks of ERC-20 transfers on a ``--no-mining`` anvil, stamping each
    block as the devnet does (12 s apart) and recording when ``evm_mine`` returned."""

    def __init__(self, rpc: JsonRpcClient, net: Devnet, head: int, transfers: int) -> None:
        self._rpc = rpc
        self._net = net
        self._head = head
        self._transfers = transfers
        self._turn = 0

    def _transactions(self) -> list[dict[str, Any]]:
        accounts, tokens = self._net.accounts, self._net.tokens
        txs = []
        for i in range(self._transfers):
            self._turn += 1
            sender = accounts[self._turn % len(accounts)]
            receiver = accounts[(self._turn + 1 + i) % len(accounts)]
            token = tokens[self._turn % len(tokens)].address
            data = transfer_data(receiver, 10**15 + self._turn)
            txs.append(
                {"from": sender, "to": token, "gas": quantity(TOKEN_TRANSFER_GAS), "data": data}
            )
        return txs

    async def mine(self) -> tuple[int, float]:
        """One block; its number and when it was mined."""
        await self._rpc.batch([("eth_sendTransaction", [tx]) for tx in self._transactions()])
        number = self._head + 1
        stamp = self._net.genesis_timestamp + number * self._net.interval_s
        await self._rpc.request("evm_mine", [stamp])
        mined = now_ms()
        self._head = number
        return number, mined


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


STAGES: tuple[tuple[str, str, str], ...] = (
    # (label, from, to)
    ("mined → ingested", "mined", "ingested"),
    ("ingested → seen by follow", "ingested", "seen"),
    ("seen → writer stamp", "seen", "stamped"),
    ("writer stamp → committed", "stamped", "committed"),
    ("committed → follow event", "committed", "reported"),
    ("mined → committed", "mined", "committed"),
    ("mined → writer stamp", "mined", "stamped"),
    ("mined → follow event", "mined", "reported"),
)


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


def print_table(stats: dict[str, Any], params: dict[str, Any]) -> None:
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()))
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


def ingest_command(args: argparse.Namespace, rpc_url: str, chain_url: str) -> list[str]:
    blockx = shutil.which("blockx")
    assert blockx is not None, "blockx is not installed (uv sync)"
    poll = ["--poll-interval", str(args.ingest_poll_ms / 1000)]
    return [blockx, "chain", "ingest", "--rpc", rpc_url, "--db", chain_url, "--follow", *poll]


async def wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def run(args: argparse.Namespace, anvil: Anvil, root: Path) -> dict[str, Any]:
    chain_db, sink_db = root / "chain.db", root / "sink.db"
    chain_url, sink_url = f"sqlite:///{chain_db}", f"sqlite:///{sink_db}"
    functions = EXAMPLES
    ingest_log = (root / "ingest.log").open("wb")
    timeline = Timeline()
    async with EtcdServer() as etcd, JsonRpcClient(anvil.url) as rpc:
        net = Devnet(rpc)
        setup = await net.setup(tokens=3)
        head = setup[-1].number
        probe = Probe(chain_db, sink_db, head + 1, args.probe_ms / 1000)
        feeder = await asyncio.create_subprocess_exec(
            *ingest_command(args, anvil.url, chain_url),
            stdout=ingest_log,
            stderr=subprocess.STDOUT,
        )
        cluster = ChainCluster(
            etcd,
            root,
            RegistryKind.BLOCK,
            chain_url=chain_url,
            sink_url=sink_url,
            functions=functions,
            BLOCKX_LOG_LEVEL="WARNING",
        )
        probe.start()
        stop = asyncio.Event()
        try:
            await cluster.wait_ready()
            await wait_for("ingest of the setup blocks", lambda: head in probe.ingested_ms, 60)
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
                        from_block=head + 1,
                        poll_interval_s=args.follow_poll_ms / 1000,
                        stop=stop,
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
                miner = Miner(rpc, net, head, args.transfers)
                total = args.warm_up + args.blocks
                # Warm-up blocks, one by one: code loaded, connections open.
                for _ in range(args.warm_up):
                    number, _ = await miner.mine()
                    await wait_for(f"warm-up block {number}", timeline.has(number), 60)
                first = head + args.warm_up + 1
                started = time.monotonic()
                for i in range(args.blocks):
                    delay = started + i * args.interval_ms / 1000 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    number, mined = await miner.mine()
                    timeline.mined[number] = mined
                mining_s = time.monotonic() - started
                last = head + total
                await wait_for(
                    "every block in the sink",
                    lambda: last in timeline.reported and last in probe.committed_ms,
                    120,
                )
                stop.set()
                await asyncio.wait_for(follower, 30)
        finally:
            stop.set()
            probe.halt()
            feeder.send_signal(signal.SIGTERM)
            try:
                ingest_exit = await asyncio.wait_for(feeder.wait(), 30)
            except TimeoutError:
                feeder.kill()
                ingest_exit = await feeder.wait()
            ingest_log.close()
            cluster.stop()
    measured = list(range(first, last + 1))
    stamped = read_stamps(sink_db)
    instants = {
        "mined": timeline.mined,
        "ingested": probe.ingested_ms,
        "seen": timeline.seen,
        "stamped": stamped,
        "committed": probe.committed_ms,
        "reported": timeline.reported,
    }
    missing = [n for n in measured if n not in timeline.reported]
    return {
        "stats": summarize(instants, measured),
        "mining_s": round(mining_s, 2),
        "rows": sum(timeline.rows.get(n, 0) for n in measured),
        "missing": missing,
        "problems": timeline.problems,
        "ingest_exit": ingest_exit,
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
    parser.add_argument("--blocks", type=int, default=200, help="blocks measured")
    parser.add_argument("--interval-ms", type=float, default=250, help="one block every so often")
    parser.add_argument("--transfers", type=int, default=3, help="ERC-20 transfers per block")
    parser.add_argument(
        "--ingest-poll-ms",
        type=float,
        default=INGEST_POLL_S * 1000,
        help="`blockx chain ingest --poll-interval`",
    )
    parser.add_argument(
        "--follow-poll-ms",
        type=float,
        default=FOLLOW_POLL_S * 1000,
        help="`blockx follow --poll-interval`",
    )
    parser.add_argument("--probe-ms", type=float, default=5, help="the probe's read interval")
    parser.add_argument("--warm-up", type=int, default=5, help="blocks mined first, not measured")
    args = parser.parse_args()
    if args.blocks < 1 or args.interval_ms < 0 or args.transfers < 1:
        parser.error("--blocks and --transfers must be >= 1, --interval-ms >= 0")
    params = {
        "blocks": args.blocks,
        "interval_ms": args.interval_ms,
        "transfers_per_block": args.transfers,
        "ingest_poll_ms": args.ingest_poll_ms,
        "follow_poll_ms": args.follow_poll_ms,
        "follow_tasks_in_flight": DEFAULT_TASKS_IN_FLIGHT,
        "executors": 2,
        "probe_ms": args.probe_ms,
        "warm_up": args.warm_up,
        "cores": os.cpu_count(),
    }
    root = Path(tempfile.mkdtemp(prefix="head-latency-bench-"))
    try:
        with Anvil() as anvil:
            result = asyncio.run(run(args, anvil, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(result["stats"], params)
    print(
        f"mined {args.blocks} blocks in {result['mining_s']} s; {result['rows']} sink rows; "
        f"missing {len(result['missing'])}; retries/failures {len(result['problems'])}"
    )
    print(json.dumps({"bench": "head_latency", "params": params, **result}))


if __name__ == "__main__":
    main()
