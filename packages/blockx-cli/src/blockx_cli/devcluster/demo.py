"""``blockx demo``: a local cluster in the background, block-statistics tasks on it
through the client (every RPC via the proxy), a live view, a summary."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blockx_cli.devcluster.background import LocalCluster
from blockx_cli.output import EXIT_FAILED, EXIT_OK, EXIT_SERVICE, fail
from blockx_client import BlockxError, Client, Task, TaskResult


def demo(tasks: int, blocks: int, examples: Path, console: Console) -> int:
    """Start a local cluster, run block-statistics tasks live, print the results.

    ``examples`` is a resolved directory with functions/ (the command checks it)."""
    started = time.monotonic()
    console.print(
        "[bold]BlockX demo[/]: starting a local cluster (etcd, coordinator, worker, "
        "sync invoker, proxy)..."
    )
    cluster = LocalCluster(examples)
    try:
        try:
            endpoints = cluster.wait_ready()
        except RuntimeError as exc:
            fail(str(exc), EXIT_SERVICE)
        console.print(
            f"  up in {time.monotonic() - started:.1f} s; every RPC goes through the proxy at "
            f"unix:{endpoints['proxy_socket']}\n"
        )
        try:
            code = asyncio.run(_workload(endpoints, tasks, blocks, console))
        except BlockxError as exc:
            fail(exc.message, EXIT_SERVICE, hint=f"the cluster's log: {cluster.log}")
    finally:
        console.print("[dim]stopping the local cluster...[/]")
        cluster.stop()
    console.print(f"done in {time.monotonic() - started:.1f} s")
    return code


async def _workload(endpoints: dict[str, str], tasks: int, blocks: int, console: Console) -> int:
    first_block = 19_000_000
    work = [
        Task.call_list(
            "block_stats",
            [[first_block + t * blocks + b] for b in range(blocks)],
            task_id=f"demo-{os.getpid()}-{t:03d}",
        )
        for t in range(tasks)
    ]
    results: list[TaskResult] = []
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    bar = progress.add_task("tasks", total=tasks)
    calls = progress.add_task("calls", total=tasks * blocks)
    async with Client(proxy_socket=endpoints["proxy_socket"]) as client:
        handle = client.function("block_stats")
        check = await handle.precheck(first_block)
        console.print(
            f"precheck block_stats{check.signature}: {'ok' if check.ok else check.message}"
        )
        one = await handle.invoke(first_block)
        d = one.durations
        console.print(
            f"sync invoke block_stats({first_block}) -> {json.dumps(one.value)}\n"
            f"  [dim]cpu {d.cpu_us} µs, io {d.io_us} µs, queue {d.queue_us} µs[/]\n"
        )
        console.print(f"running {tasks} tasks x {blocks} blocks (one call per block)...")
        with Live(Group(progress), console=console, refresh_per_second=10) as live:
            async for result in client.run_many(work, concurrency=8):
                results.append(result)
                progress.update(bar, completed=len(results))
                progress.update(calls, advance=blocks)
                live.update(Group(_recent(results), progress))
    console.print()
    console.print(_summary(results))
    failed = [r for r in results if not r.ok]
    for r in failed:
        console.print(f"[red]{r.task_id}: {r.failure_code}[/] {r.failure_message[:200]}")
    return EXIT_FAILED if failed else EXIT_OK


def _recent(results: list[TaskResult]) -> Table:
    table = Table(title="latest tasks", expand=False)
    for column in ("task", "state", "worker", "txs"):
        table.add_column(column)
    for r in results[-6:]:
        rows = r.outputs() or []
        label = "#" + r.task_id.rsplit("-", 1)[-1]
        table.add_row(label, r.state.value, r.worker_addr, str(sum(x["txs"] for x in rows)))
    return table


def _summary(results: list[TaskResult]) -> Table:
    table = Table(title="results: block statistics per task (synthetic blocks, not chain data)")
    for column in ("task", "blocks", "txs", "gas used", "top transfer $", "state"):
        table.add_column(column, justify="left" if column in ("task", "blocks") else "right")
    total_txs = total_gas = 0
    for r in sorted(results, key=lambda r: r.task_id):
        rows: list[dict[str, Any]] = r.outputs() or []
        txs = sum(x["txs"] for x in rows)
        gas = sum(x["gas"] for x in rows)
        largest = max((x["largest_usd"] for x in rows), default=0)
        total_txs += txs
        total_gas += gas
        span = f"{rows[0]['block']}-{str(rows[-1]['block'])[-3:]}" if rows else "-"
        label = "#" + r.task_id.rsplit("-", 1)[-1]
        table.add_row(label, span, f"{txs:,}", f"{gas:,}", f"{largest:,.0f}", r.state.value)
    table.caption = f"{len(results)} tasks, {total_txs:,} transactions, {total_gas:,} gas"
    return table
