"""Backfill benchmark: ERC-20 volume per block and token, from the block database into
a sink table, through the bundle cluster versus a hand-written pipeline.

Run: uv run python bench/backfill_bench.py [--blocks 10000] [--dense] [--rounds 5]
     [--blocks-per-task 1000] [--in-flight 4] [--cache-dir DIR]
     [--worker-env NAME=VALUE ...] [--cli-arg ARG ...]

The chain: anvil + ``Devnet`` (3 test tokens, 4 ERC-20 and 1 ETH transfer a block;
with ``--dense`` the generator's dense blocks, about 150 transactions and 400 logs
each), ingested into a SQLite block database once and cached under ``--cache-dir``
(default: ``$TMPDIR/blockx-bench``), so re-runs start at once. Over blocks
``0..--blocks - 1``, the same function (``token_volume`` of
``examples/functions/chain.py``) in four ways:

* ``cli``: what a user runs, ``blockx backfill --function token_volume
  --source-table erc20_transfers --unit block --from 0 --to N-1 --sink-table T
  --json`` (docs/backfill.md) with every default, as a child process, the block
  database, sink and bundle Coordinator given by ``BLOCKDB_URL``, ``SINK_DB_URL``
  and ``BLOCKX_BUNDLE_COORDINATOR``; wall clock from its start to its exit
  (start-up included), and beside it the seconds of its own ``done`` event. The
  cluster is what ``blockx dev up`` starts: etcd, a ``blockx-bundle-coordinator``
  and a ``blockx-bundle-worker`` with 2 executors (dev up's default), writing a
  SQLite sink;
* ``tuned``: the same cluster driven through ``blockx_client.run_many`` with the
  benchmark's own settings: tasks of ``--blocks-per-task`` blocks, one transaction
  per task (``bundleSize`` = the task's blocks), typed sink columns,
  ``--in-flight`` tasks at a time, a warm client; wall clock from the first
  submission to the last result. Labelled TUNED: no user gets it by default;
* ``hand``: what a user writes by hand: asyncio with a ``ProcessPoolExecutor(2)``;
  per range of ``--blocks-per-task`` blocks, one query reads the blocks with their
  transfers, a pool process groups them by block and calls the same function,
  and the rows are written with ``executemany`` in one transaction per range into
  another SQLite file; ``--in-flight`` ranges at a time; the pool is warm;
* ``group_by``: one SQL statement computing the same aggregate inside SQLite
  (``INSERT ... SELECT ... GROUP BY``), the IO ceiling. SQLite cannot sum uint256
  exactly, so its volume is a REAL: its rows are compared on everything else.

One untimed warm-up round of ``tuned`` and ``hand`` runs first (the first round
of a fresh Worker is slower; the CLI always starts cold). Prints a table of
seconds, blocks/s, rows/s and ratios to ``hand`` (goal: ``cli`` >= 1.0 x hand),
whether the sink tables hold the same rows as the hand pipeline's, and one JSON
line. Each figure is the median of ``--rounds`` rounds, the kinds interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import resource
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

from proc_status import children, cpu_ns

from blockx_chain.devnet import DENSE, Anvil, BlockShape, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.processes import Child, grpc_serving, wait_serving
from blockx_client import Client, PluginConfig, Task
from blockx_server.etcd.local import EtcdServer

ROOT: Final = Path(__file__).resolve().parents[1]
FUNCTIONS: Final = ROOT / "examples" / "functions"
SPARSE: Final = BlockShape(token_transfers=4, eth_transfers=1)
COLUMNS: Final = {
    "token": "TEXT",
    "transfers": "INTEGER",
    "volume": "NUMERIC",
    "senders": "INTEGER",
}
KEY: Final = ["block_number", "token"]
OUT_COLUMNS: Final = "block_number, block_hash, token, transfers, volume, senders"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---- the chain, generated once --------------------------------------------------------


async def generate(path: Path, blocks: int, shape: BlockShape) -> dict[str, float]:
    """Mine ``blocks`` blocks of ``shape`` on a fresh anvil and ingest them into ``path``."""
    with Anvil() as node:
        started = time.perf_counter()
        async with JsonRpcClient(node.url) as client:
            net = Devnet(client)
            await net.setup(tokens=3)
            if shape.swaps:
                await net.setup_pair()
            mined = await net.mine(
                blocks,
                token_transfers=shape.token_transfers,
                eth_transfers=shape.eth_transfers,
                swaps=shape.swaps,
            )
        mine_s = time.perf_counter() - started
        started = time.perf_counter()
        options = IngestOptions(to_block=mined[-1].number, batch_size=100)
        await ingest(node.url, parse_blockdb_url(f"sqlite:///{path}"), options)
        return {"mine_s": mine_s, "ingest_s": time.perf_counter() - started}


def chain_file(cache_dir: Path, blocks: int, shape: BlockShape) -> tuple[Path, dict[str, Any]]:
    kinds = f"{shape.token_transfers}-{shape.eth_transfers}-{shape.swaps}"
    path = cache_dir / f"chain-{blocks}-{kinds}.db"
    if path.exists():
        return path, {"cached": True}
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{partial}{suffix}").unlink(missing_ok=True)
    print(f"generating {blocks:,} blocks into {path} (once)...", file=sys.stderr, flush=True)
    took = asyncio.run(generate(partial, blocks, shape))
    with contextlib.closing(sqlite3.connect(partial)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE")
    partial.rename(path)
    print(
        f"  mined in {took['mine_s']:.1f} s, ingested in {took['ingest_s']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return path, {"cached": False, **took}


def ranges(blocks: int, per_task: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + per_task, blocks) - 1) for lo in range(0, blocks, per_task)]


# ---- the bundle cluster ---------------------------------------------------------------


class BundleCluster:
    """etcd, a bundle Coordinator and a bundle Worker with 2 executors."""

    def __init__(
        self, chain: Path, sink: Path, log: Any, extra_env: dict[str, str] | None = None
    ) -> None:
        self.chain, self.sink, self.log = chain, sink, log
        self.extra_env = extra_env or {}
        self.etcd = EtcdServer()
        self.children: list[Child] = []
        self.coordinator = f"127.0.0.1:{free_port()}"
        self.worker_port = free_port()

    async def start(self) -> None:
        await self.etcd.start()
        etcd = {"ETCD_ENDPOINTS": self.etcd.endpoint}
        coordinator = await Child.start(
            "bundle-coordinator",
            "blockx-bundle-coordinator",
            {
                **etcd,
                "COORDINATOR_LISTEN": self.coordinator,
                "COORDINATOR_CPU_RED_LINE": "1.0",
                "COORDINATOR_MEMORY_RED_LINE": "1.0",
            },
            self.log,
        )
        worker = await Child.start(
            "bundle-worker",
            "blockx-bundle-worker",
            {
                **etcd,
                "WORKER_LISTEN": f"127.0.0.1:{self.worker_port}",
                "FUNCTIONS_DIR": str(FUNCTIONS),
                "EXECUTOR_COUNT": "2",
                "BLOCKDB_URL": f"sqlite:///{self.chain}",
                "SINK_DB_URL": f"sqlite:///{self.sink}",
                **self.extra_env,
            },
            self.log,
        )
        self.children = [coordinator, worker]
        await wait_serving(
            worker, "worker", grpc_serving(self.worker_port, "worker.v1.WorkerService")
        )
        port = int(self.coordinator.rsplit(":", 1)[1])
        await wait_serving(
            coordinator,
            "coordinator",
            grpc_serving(port, "bundlecoordinator.v1.BundleCoordinatorService"),
        )

    def cpu_ns(self) -> dict[str, int]:
        """CPU so far of the Coordinator, the Worker and the Worker's executors."""
        coordinator, worker = (child.proc.pid for child in self.children)
        return {
            "coordinator": cpu_ns(coordinator),
            "worker": cpu_ns(worker),
            "executors": sum(cpu_ns(pid) for pid in children(worker)),
        }

    async def stop(self) -> None:
        for child in reversed(self.children):
            await child.stop()
        await self.etcd.close()


def bundle_task(lo: int, hi: int, table: str, task_id: str) -> Task:
    scan = {
        "function": "token_volume",
        "table": "erc20_transfers",
        "fromBlock": lo,
        "toBlock": hi,
        "bundleSize": hi - lo + 1,
        "unit": "block",
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
    tasks = [bundle_task(lo, hi, table, f"bench-{table}-{lo}") for lo, hi in spans]
    started = time.perf_counter()
    async for result in client.run_many(tasks, concurrency=in_flight):
        if not result.ok:
            raise RuntimeError(f"{result.task_id}: {result.failure_code} {result.failure_message}")
    return time.perf_counter() - started


def blockx_command() -> Path:
    """The ``blockx`` script of this environment (the one ``uv run blockx`` runs)."""
    return Path(sys.executable).parent / "blockx"


async def run_cli(
    cluster: BundleCluster, blocks: int, table: str, extra: list[str]
) -> tuple[float, dict[str, Any]]:
    """``blockx backfill`` as docs/backfill.md shows it, with every default, as a child
    process: wall time from its start to its exit (start-up included). The databases
    and the bundle Coordinator come from the environment, as from a dev cluster's."""
    # An installed blockx has its bytecode cached (pip and uv write it, or the
    # first run does); a PYTHONDONTWRITEBYTECODE of this shell would make every
    # round compile the workspace's sources again, which no user pays.
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {
        **inherited,
        "BLOCKDB_URL": f"sqlite:///{cluster.chain}",
        "SINK_DB_URL": f"sqlite:///{cluster.sink}",
        "BLOCKX_BUNDLE_COORDINATOR": cluster.coordinator,
    }
    argv = [
        *("backfill", "--function", "token_volume", "--source-table", "erc20_transfers"),
        *("--unit", "block", "--from", "0", "--to", str(blocks - 1), "--sink-table", table),
        "--json",
        *extra,
    ]
    started = time.perf_counter()
    child = await asyncio.create_subprocess_exec(
        blockx_command(),
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    took = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"blockx backfill exited {child.returncode}: {err.decode()[-2000:]}")
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    done = next(event for event in events if event.get("event") == "done")
    return took, done


# ---- by hand: asyncio + ProcessPoolExecutor --------------------------------------------

_FUNCTION: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
_RANGE_SQL: Final = (
    "SELECT b.block_number AS number, b.block_hash AS hash, t.* FROM blocks b "
    "LEFT JOIN erc20_transfers t ON t.block_number = b.block_number "
    "WHERE b.block_number BETWEEN ? AND ? ORDER BY b.block_number, t.log_index"
)


def _token_volume() -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The example module's function, loaded once per pool process."""
    global _FUNCTION
    if _FUNCTION is None:
        spec = importlib.util.spec_from_file_location("chain_functions", FUNCTIONS / "chain.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FUNCTION = module.token_volume
    return _FUNCTION


def warm() -> None:
    _token_volume()


def compute_range(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Group one range's joined rows by block and call the function per block."""
    function = _token_volume()
    out: list[tuple[Any, ...]] = []
    blocks: dict[int, tuple[str, list[dict[str, Any]]]] = {}
    for record in records:
        number, block_hash = record.pop("number"), record.pop("hash")
        entry = blocks.setdefault(number, (block_hash, []))
        if record["log_index"] is not None:
            entry[1].append(record)
    for number, (block_hash, rows) in blocks.items():
        block = {"block_number": number, "block_hash": block_hash}
        for row in function({"block": block, "rows": rows}):
            out.append(
                (
                    number,
                    block_hash,
                    row["token"],
                    row["transfers"],
                    str(row["volume"]),
                    row["senders"],
                )
            )
    return out


def read_range(chain: Path, lo: int, hi: int) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(f"file:{chain}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(_RANGE_SQL, (lo, hi))]


def create_out(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(
        "CREATE TABLE token_volume (block_number INTEGER, block_hash TEXT, token TEXT, "
        "transfers INTEGER, volume TEXT, senders INTEGER, PRIMARY KEY (block_number, token))"
    )
    return db


def write_range(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.executemany(f"INSERT INTO token_volume ({OUT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.execute("COMMIT")


async def run_hand(
    pool: ProcessPoolExecutor, chain: Path, out: Path, spans: list[tuple[int, int]], in_flight: int
) -> float:
    loop = asyncio.get_running_loop()
    db = create_out(out)
    gate = asyncio.Semaphore(in_flight)
    write_lock = asyncio.Lock()

    async def one(lo: int, hi: int) -> None:
        async with gate:
            records = await asyncio.to_thread(read_range, chain, lo, hi)
            rows = await loop.run_in_executor(pool, compute_range, records)
            async with write_lock:
                await asyncio.to_thread(write_range, db, rows)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(lo, hi) for lo, hi in spans))
        return time.perf_counter() - started
    finally:
        db.close()


# ---- the SQL lower bound ----------------------------------------------------------------


def run_group_by(chain: Path, out: Path, blocks: int) -> float:
    db = sqlite3.connect(out, isolation_level=None)
    try:
        db.execute("ATTACH DATABASE ? AS chain", (f"file:{chain}?mode=ro",))
        started = time.perf_counter()
        db.execute("BEGIN")
        db.execute(
            "CREATE TABLE token_volume AS SELECT t.block_number, t.block_hash, t.token, "
            "count(*) AS transfers, sum(CAST(t.value AS REAL)) AS volume, "
            "count(DISTINCT t.from_address) AS senders FROM chain.erc20_transfers t "
            "WHERE t.block_number BETWEEN 0 AND ? GROUP BY t.block_number, t.token",
            (blocks - 1,),
        )
        db.execute("COMMIT")
        return time.perf_counter() - started
    finally:
        db.close()


# ---- CPU spent -----------------------------------------------------------------------


def pool_cpu_ns(pids: list[int]) -> dict[str, int]:
    return {"pool": sum(cpu_ns(pid) for pid in pids)}


class CpuSpent:
    """CPU seconds each kind spent, per process, over each of its rounds: the
    processes ``measure`` is given, plus this process (``own``: the client or the
    hand pipeline's main process) or the children it reaped (``children_rusage``:
    the ``blockx backfill`` child)."""

    def __init__(self) -> None:
        self.rounds: dict[str, list[dict[str, float]]] = {}

    @contextlib.contextmanager
    def measure(
        self,
        kind: str,
        processes: Callable[[], dict[str, int]],
        *,
        own: bool = False,
        children_rusage: bool = False,
    ) -> Any:
        before, own_before, reaped_before = processes(), time.process_time(), _reaped_cpu_s()
        yield
        spent = {name: (ns - before[name]) / 1e9 for name, ns in processes().items()}
        if own:
            spent["bench process"] = time.process_time() - own_before
        if children_rusage:
            spent["cli"] = _reaped_cpu_s() - reaped_before
        self.rounds.setdefault(kind, []).append(spent)

    def medians(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind, rounds in self.rounds.items():
            medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
            medians["total"] = statistics.median(sum(r.values()) for r in rounds)
            out[kind] = {name: round(seconds, 3) for name, seconds in medians.items()}
        return out


def _reaped_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---- comparing ---------------------------------------------------------------------------


def table_rows(path: Path, table: str, columns: str = OUT_COLUMNS) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return db.execute(f"SELECT {columns} FROM {table} ORDER BY block_number, token").fetchall()


def normalised(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows with the volume as text: a sink column inferred INTEGER and widened to
    NUMERIC holds small volumes as integers, the hand pipeline's as text."""
    return [
        (n, h, token, transfers, str(volume), senders)
        for n, h, token, transfers, volume, senders in rows
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument(
        "--dense",
        action="store_true",
        help=f"dense blocks ({DENSE.token_transfers} token transfers and {DENSE.swaps} swaps: "
        "about 150 transactions and 400 logs a block)",
    )
    p.add_argument("--blocks-per-task", type=int, default=1000)
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra variable for the bundle Worker (repeatable)",
    )
    p.add_argument(
        "--cli-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for blockx backfill (repeatable, e.g. --cli-arg=--bundle-size=1000;"
        " the figure is then no longer the defaults')",
    )
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "blockx-bench")
    args = p.parse_args()
    chain, generated = chain_file(args.cache_dir, args.blocks, DENSE if args.dense else SPARSE)
    spans = ranges(args.blocks, args.blocks_per_task)
    work = Path(tempfile.mkdtemp(prefix="blockx-backfill-bench-"))
    try:
        with open(work / "cluster.log", "w") as log:
            result = asyncio.run(bench(args, chain, spans, work, log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["chain"] = {"file": str(chain), "dense": args.dense, **generated}
    report(result, args)


async def bench(
    args: argparse.Namespace, chain: Path, spans: list[tuple[int, int]], work: Path, log: Any
) -> dict[str, Any]:
    sink = work / "sink.db"
    times: dict[str, list[float]] = {"cli": [], "cli_own_clock": [], "tuned": [], "hand": []}
    times["group_by"] = []
    extra = dict(item.split("=", 1) for item in args.worker_env)
    cluster = BundleCluster(chain, sink, log, extra)
    cpu = CpuSpent()
    try:
        await cluster.start()
        async with Client(bundle_coordinator=cluster.coordinator) as client:
            # One warm-up round of each: steady-state throughput is measured (the
            # Worker a user backfills with has run before; the CLI starts cold).
            await run_blockx(client, spans, "warmup", args.in_flight)
            with ProcessPoolExecutor(2) as pool:
                await asyncio.gather(*(asyncio.wrap_future(pool.submit(warm)) for _ in range(2)))
                await run_hand(pool, chain, work / "hand-warmup.db", spans, args.in_flight)
                pool_pids = list(pool._processes)  # the pool is warm: all started
                for r in range(args.rounds):
                    with cpu.measure("cli", cluster.cpu_ns, children_rusage=True):
                        took, done = await run_cli(cluster, args.blocks, f"cli_{r}", args.cli_arg)
                    times["cli"].append(took)
                    times["cli_own_clock"].append(float(done["seconds"]))
                    with cpu.measure("tuned", cluster.cpu_ns, own=True):
                        times["tuned"].append(
                            await run_blockx(client, spans, f"token_volume_{r}", args.in_flight)
                        )
                    with cpu.measure("hand", lambda: pool_cpu_ns(pool_pids), own=True):
                        times["hand"].append(
                            await run_hand(
                                pool, chain, work / f"hand-{r}.db", spans, args.in_flight
                            )
                        )
                    times["group_by"].append(
                        await asyncio.to_thread(
                            run_group_by, chain, work / f"group-{r}.db", args.blocks
                        )
                    )
    finally:
        await cluster.stop()
    cli_rows = normalised(table_rows(sink, "cli_0"))
    tuned_rows = normalised(table_rows(sink, "token_volume_0"))
    hand_rows = normalised(table_rows(work / "hand-0.db", "token_volume"))
    counted = "block_number, block_hash, token, transfers, senders"
    group_rows = table_rows(work / "group-0.db", "token_volume", counted)
    blocks, rows = args.blocks, len(hand_rows)
    with contextlib.closing(sqlite3.connect(f"file:{chain}?mode=ro", uri=True)) as db:
        query = "SELECT count(*) FROM erc20_transfers WHERE block_number < ?"
        transfers = int(db.execute(query, (blocks,)).fetchone()[0])
    median = {kind: statistics.median(seconds) for kind, seconds in times.items()}
    return {
        "blocks": blocks,
        "tasks": len(spans),
        "rows": rows,
        "transfers": transfers,
        "transfers_per_s": {k: round(transfers / v) for k, v in median.items()},
        "seconds": {k: round(v, 3) for k, v in median.items()},
        "blocks_per_s": {k: round(blocks / v) for k, v in median.items()},
        "rows_per_s": {k: round(rows / v) for k, v in median.items()},
        "cli_over_hand": round(median["hand"] / median["cli"], 3),
        "cli_own_clock_over_hand": round(median["hand"] / median["cli_own_clock"], 3),
        "tuned_over_hand": round(median["hand"] / median["tuned"], 3),
        "hand_over_group_by": round(median["group_by"] / median["hand"], 3),
        "identical_rows": {"cli": cli_rows == hand_rows, "tuned": tuned_rows == hand_rows},
        "group_by_counts_match": [(r[0], r[1], r[2], r[3], r[5]) for r in hand_rows] == group_rows,
        "rounds": {k: [round(s, 3) for s in v] for k, v in times.items()},
        "cpu_s": cpu.medians(),
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    per_s, rows_s, secs = result["blocks_per_s"], result["rows_per_s"], result["seconds"]
    hand = per_s["hand"]
    shape = "dense " if args.dense else ""
    print(
        f"\nbackfill of {result['blocks']:,} {shape}blocks ({result['transfers']:,} transfers "
        f"read, {result['rows']:,} rows written), "
        f"2 processes each, median of {args.rounds} rounds (kinds interleaved)"
    )
    print(f"{'pipeline':<52}{'seconds':>9}{'blocks/s':>10}{'rows/s':>10}{'vs hand':>9}")
    names = {
        "cli": "blockx backfill, defaults (wall, with start-up)",
        "cli_own_clock": "  the same, by its own clock ('done' seconds)",
        "tuned": f"TUNED: run_many, bundle={args.blocks_per_task}, {args.in_flight} in flight",
        "hand": f"by hand (asyncio + ProcessPoolExecutor(2), {args.in_flight} in flight)",
        "group_by": "SQL GROUP BY (IO ceiling)",
    }
    for kind, name in names.items():
        print(
            f"{name:<52}{secs[kind]:>9.3f}{per_s[kind]:>10,}{rows_s[kind]:>10,}"
            f"{per_s[kind] / hand:>8.2f}x"
        )
    print(f"blockx backfill (defaults, wall) / hand: {result['cli_over_hand']:.2f}x (goal >= 1.0)")
    read = result["transfers_per_s"]
    print(f"transfers read/s: blockx backfill {read['cli']:,}, by hand {read['hand']:,}")
    print("CPU seconds per round (median), by process:")
    for kind, spent in result["cpu_s"].items():
        shown = ", ".join(f"{name} {seconds:.3f}" for name, seconds in spent.items())
        per_block = spent["total"] / result["blocks"] * 1e6
        print(f"  {kind:<6} {shown} ({per_block:.1f} us a block)")
    print(f"identical rows vs by hand: {result['identical_rows']}")
    print(
        f"GROUP BY counts match (volume as REAL, not compared): {result['group_by_counts_match']}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
