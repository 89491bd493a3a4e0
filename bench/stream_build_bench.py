"""Streaming build versus eager build: one BlockBundleCallConfig task over many rows.

Run: uv run python bench/stream_build_bench.py [--rows 100000,1000000] [--per-block 100]
     [--modes stream,eager]

The block database is SQLite, its ``erc20_transfers`` rows written straight in with
executemany (``--rows`` rows, ``--per-block`` per block). For each mode a fresh
``blockx-bundle-worker`` (2 executors, STREAM_BUILD_ENABLED on or off) runs one task
over the whole range: ``unit: "row"``, a function that returns None (so the outputs
the Calls phase collects stay small and the figures are the builder's), written by
BlockBundleWriteResultHandler (only its ledger rows, one per block). Measured: wall
time from SubmitTask to the terminal update, and peak RSS: the Worker process's
VmHWM, the largest executor's VmHWM, and the peak of Worker + executors sampled
every 50 ms (with how many processes were alive at that sample; a child not yet
past exec is left out, since it still runs in the Worker's pages), and what the
process's IO read cache (IO_CACHE_MAX_BYTES, 256 MiB by default, process-wide;
``--io-cache-bytes`` sets it) holds at the end: nothing, as a Builder's scan and the
bundle writer's canonical check read fresh, unless a change makes them cache.
Prints a table per row count, then one JSON line each, then, with two row counts or
more, each mode's peak RSS at the largest count over its peak at the smallest (the
goal: a streamed build's memory is flat over the range, within 1.2x from 100,000
to 1,000,000 rows, since BlockBundleWriteResultHandler commits each finished
bundle during the Calls phase).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import contextlib

from chain_bulk import bulk_chain
from grpclib.client import Channel
from proc_status import status_kb
from processes import WorkerProcess, execute_result, run_to_end

from blockx_core.registry import LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = "def noop(row):\n    return None\n"


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _tree_rss_kb(pid: int) -> tuple[int, int]:
    """VmRSS of the Worker and its executors, summed, and how many processes that is.
    A child between fork and exec (an executor being spawned, as one replaced after
    EXECUTOR_MAX_CALLS is) still runs in the Worker's pages under the Worker's command
    line: counted, it would count the Worker twice, so it is left out."""
    worker = _cmdline(pid)
    processes = [pid, *(p for p in _descendants(pid) if _cmdline(p) != worker)]
    return sum(status_kb(p, "VmRSS") for p in processes), len(processes)


async def _sample(pid: int, peak: dict[str, int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        total, processes = _tree_rss_kb(pid)
        if total > peak.get("total_kb", 0):
            peak["total_kb"], peak["processes"] = total, processes
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def run_mode(
    workdir: Path, etcd: EtcdServer, chain: Path, blocks: int, stream: bool, cache: int | None
) -> dict[str, Any]:
    mode = "stream" if stream else "eager"
    sink = workdir / f"sink-{mode}.db"
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
            "FUNCTIONS_DIR": str(workdir / "functions"),
            "BLOCKDB_URL": f"sqlite:///{chain}",
            "SINK_DB_URL": f"sqlite:///{sink}",
            "STREAM_BUILD_ENABLED": "true" if stream else "false",
            "EXECUTOR_COUNT": "2",
            "TASK_DEADLINE_MS": "3600000",
            "BLOCKX_LOG_LEVEL": "WARNING",
            **({} if cache is None else {"IO_CACHE_MAX_BYTES": str(cache)}),
        },
        workdir / f"worker-{mode}.log",
        program="blockx-bundle-worker",
    )
    try:
        await worker.wait_ready()
        pid = worker.proc.pid
        idle_kb, _ = _tree_rss_kb(pid)
        config = {
            "function": "noop",
            "table": "erc20_transfers",
            "fromBlock": 0,
            "toBlock": blocks - 1,
            "bundleSize": 1000,
        }
        task = worker_v1.TaskInput(
            task_id=f"bench-{mode}",
            function_call_config=worker_v1.FunctionCallConfig(
                type="BlockBundleCallConfig", config=json.dumps(config)
            ),
            result_handler=worker_v1.ResultHandler(
                type="BlockBundleWriteResultHandler", config=json.dumps({"table": "bench"})
            ),
        )
        peak: dict[str, int] = {}
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(pid, peak, stop))
        channel = Channel("127.0.0.1", worker.port)
        try:
            started = time.perf_counter()
            final = await run_to_end(worker_v1.WorkerServiceStub(channel), task, timeout=3600)
            seconds = time.perf_counter() - started
        finally:
            channel.close()
            stop.set()
            await sampler
        assert final.state is worker_v1.TaskState.SUCCEEDED, execute_result(final)
        executors = _descendants(pid)
        cached = re.search(r"^blockx_io_cache_bytes (\S+)$", worker.metrics(), re.MULTILINE)
        return {
            "mode": mode,
            "seconds": round(seconds, 2),
            "worker_peak_rss_mb": round(status_kb(pid, "VmHWM") / 1024, 1),
            "executor_peak_rss_mb": round(
                max((status_kb(p, "VmHWM") for p in executors), default=0) / 1024, 1
            ),
            "total_peak_rss_mb": round(peak.get("total_kb", 0) / 1024, 1),
            "total_peak_processes": peak.get("processes", 0),
            "idle_total_rss_mb": round(idle_kb / 1024, 1),
            "io_cache_mb": round(float(cached.group(1)) / 2**20, 1) if cached else None,
        }
    finally:
        worker.stop()


async def bench(rows: int, per_block: int, modes: list[str], cache: int | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="stream-build-bench-"))
    try:
        (workdir / "functions").mkdir()
        (workdir / "functions" / "bench.py").write_text(FUNCTIONS)
        blocks = max(1, rows // per_block)
        chain = workdir / "chain.db"
        started = time.perf_counter()
        await bulk_chain(chain, blocks, per_block)
        seeded_s = time.perf_counter() - started
        results = []
        async with EtcdServer() as etcd:
            for mode in modes:
                results.append(
                    await run_mode(workdir, etcd, chain, blocks, mode == "stream", cache)
                )
        return {
            "bench": "stream_build",
            "rows": blocks * per_block,
            "blocks": blocks,
            "seed_seconds": round(seeded_s, 1),
            "runs": results,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _table(out: dict[str, Any]) -> str:
    head = (
        "mode",
        "wall s",
        "rows/s",
        "worker peak MB",
        "executor peak MB",
        "total peak MB",
        "IO cache MB",
    )
    lines = [
        f"{out['rows']:,} rows over {out['blocks']:,} blocks (seeded in {out['seed_seconds']} s)",
        " | ".join(head),
        " | ".join("---" for _ in head),
    ]
    for run in out["runs"]:
        lines.append(
            " | ".join(
                str(v)
                for v in (
                    run["mode"],
                    run["seconds"],
                    f"{out['rows'] / run['seconds']:,.0f}",
                    run["worker_peak_rss_mb"],
                    run["executor_peak_rss_mb"],
                    f"{run['total_peak_rss_mb']} ({run['total_peak_processes']} processes; "
                    f"idle {run['idle_total_rss_mb']})",
                    run["io_cache_mb"],
                )
            )
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", default="100000,1000000", help="comma-separated row counts, one run each"
    )
    parser.add_argument("--per-block", type=int, default=100)
    parser.add_argument("--modes", default="stream,eager", help="comma-separated: stream, eager")
    parser.add_argument(
        "--io-cache-bytes", type=int, default=None, help="IO_CACHE_MAX_BYTES (default: unset)"
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("stream", "eager") for m in modes):
        parser.error("--modes takes stream and/or eager")
    try:
        counts = sorted({int(r) for r in args.rows.split(",") if r.strip()})
    except ValueError:
        parser.error("--rows takes comma-separated row counts")
    if not counts or counts[0] < 1:
        parser.error("--rows takes row counts >= 1")
    outs = []
    for rows in counts:
        out = asyncio.run(bench(rows, args.per_block, modes, args.io_cache_bytes))
        print(_table(out))
        print(json.dumps(out))
        outs.append(out)
    if len(outs) > 1:
        print(_ratios(outs[0], outs[-1]))


def _ratios(small: dict[str, Any], large: dict[str, Any]) -> str:
    """Each mode's peak RSS at the largest row count over its peak at the smallest."""
    lines = [f"peak RSS at {large['rows']:,} rows / at {small['rows']:,} rows (goal <= 1.2x):"]
    for a, b in zip(small["runs"], large["runs"], strict=True):
        worker = b["worker_peak_rss_mb"] / a["worker_peak_rss_mb"]
        total = b["total_peak_rss_mb"] / a["total_peak_rss_mb"]
        lines.append(
            f"  {a['mode']}: worker {a['worker_peak_rss_mb']} -> {b['worker_peak_rss_mb']} MB "
            f"({worker:.2f}x), worker + executors {a['total_peak_rss_mb']} -> "
            f"{b['total_peak_rss_mb']} MB ({total:.2f}x)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
