"""``blockx demo``: a local cluster with a real chain, from history to live blocks.

Stages, each timed: start the cluster (``blockx-dev`` in the background, with
anvil, the block and sink databases and both clusters) → generate blocks of ERC-20
transfers on anvil → ingest them into the block database → backfill per-block
token volume through the bundle cluster with ``blockx_drive.backfill`` → run ``swap`` over
the pair's Swap events, decoded by the Worker (``unit: "event"``) → go live (anvil
mining, ingest following, ``blockx_drive.follow`` writing each new block through the
block cluster, one reorg) → read the results back from the sink and check them
against the chain.

The first stage ends as soon as anvil and the databases are up: generating and
ingesting the chain need nothing else, so the BlockX processes go on starting
meanwhile, and the backfill waits for them to serve (a failed start ends the
demo at once). The figures say when the cluster served and how long the demo
waited for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from rich.console import Console
from rich.table import Table

from blockx_chain.devnet import Devnet
from blockx_chain.ingest import IngestError
from blockx_chain.rpc import JsonRpcClient, RpcError
from blockx_chain.sink import SinkError
from blockx_chain.store import StoreError
from blockx_cli.devcluster.background import LocalCluster
from blockx_cli.devcluster.demo.backfill import BackfillFigures, backfill_stage
from blockx_cli.devcluster.demo.chain import Ingests, Transfers, generate_stage, ingest_stage
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_cli.devcluster.demo.live import LiveFigures, live_stage
from blockx_cli.devcluster.demo.report import Check, Report, build_report, percentile
from blockx_cli.devcluster.demo.swaps import (
    SwapFigures,
    register_pair_abi,
    swap_report,
    swaps_stage,
)
from blockx_cli.launch import collect_cycles
from blockx_cli.output import EXIT_FAILED, EXIT_OK, EXIT_SERVICE, fail
from blockx_client import BlockxError, Client

T = TypeVar("T")


class DemoOptions(msgspec.Struct, frozen=True, kw_only=True):
    blocks: int = 1500
    transfers: Transfers = Transfers()
    backfill_tasks: int = 8
    backfill_tasks_in_flight: int = 4
    bundle_size: int = 50
    live_seconds: float = 5.0
    block_time_s: float = 0.25
    reorg_depth: int = 3


class Stages:
    """Prints each stage's name as it starts and its elapsed time as it ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.times: list[tuple[str, float]] = []

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        number = len(self.times) + 1
        self.console.print(f"\n[bold cyan]stage {number}: {name}[/] — {what}")
        started = time.monotonic()
        yield
        elapsed = time.monotonic() - started
        self.times.append((name, elapsed))
        self.console.print(f"  [green]✓[/] {name} in {elapsed:.1f} s")


def demo(options: DemoOptions, examples: Path, console: Console) -> int:
    """Run every stage; the exit code. ``examples`` is a resolved directory with
    functions/ (the command checks it)."""
    started = time.monotonic()
    console.print("[bold]BlockX demo[/]: functions over a real chain, from history to live blocks")
    stages = Stages(console)
    code = EXIT_FAILED
    cluster: LocalCluster | None = None
    try:
        with stages.stage(
            "start the cluster",
            "etcd, anvil, block + bundle coordinators and workers, sync invoker, proxy "
            "(the chain is used as soon as anvil answers, while the rest starts)",
        ):
            cluster = LocalCluster(examples)
            try:
                chain = cluster.wait_chain()
            except RuntimeError as exc:
                fail(str(exc), EXIT_SERVICE)
            console.print(f"  anvil answers at {chain['rpc_url']}")
        assert cluster is not None
        collect_cycles()
        try:
            code = asyncio.run(_stages(cluster, chain, options, stages, console))
        except BlockxError as exc:
            fail(exc.message, EXIT_SERVICE, hint=f"the cluster's log: {cluster.log}")
        except (IngestError, RpcError, StoreError, SinkError) as exc:
            fail(str(exc), EXIT_SERVICE, hint=f"the cluster's log: {cluster.log}")
        except RuntimeError as exc:  # the cluster did not start
            fail(str(exc), EXIT_SERVICE)
    finally:
        if cluster is not None:
            stopping = time.monotonic()
            console.print("\n[dim]stopping the local cluster...[/]")
            cluster.stop()
            console.print(f"  stopped in {time.monotonic() - stopping:.1f} s")
    console.print(f"done in {time.monotonic() - started:.1f} s")
    return code


async def _ready(cluster: LocalCluster) -> tuple[dict[str, str], float]:
    """Every endpoint once the whole cluster serves, and when (``time.monotonic``)."""

    def wait() -> tuple[dict[str, str], float]:
        return cluster.wait_ready(), time.monotonic()

    return await asyncio.to_thread(wait)


async def _unless_failed(work: Awaitable[T], cluster: asyncio.Future[Any]) -> T:
    """``work``'s result; if the cluster fails to start first, its error (``work``
    cancelled): a stage on the chain alone does not make a failed start wait."""
    task = asyncio.ensure_future(work)
    await asyncio.wait((task, cluster), return_when=asyncio.FIRST_COMPLETED)
    if cluster.done() and cluster.exception() is not None and not task.done():
        task.cancel()
        cluster.result()
    return await task


async def _stages(
    cluster: LocalCluster,
    chain: dict[str, str],
    options: DemoOptions,
    stages: Stages,
    console: Console,
) -> int:
    rpc_url, block_db = chain["rpc_url"], chain["block_db_url"]
    job = ChainJob()
    o = options
    ready = asyncio.ensure_future(_ready(cluster))
    async with JsonRpcClient(rpc_url) as rpc:
        devnet = Devnet(rpc)
        ingests = Ingests(rpc_url, block_db)
        t = o.transfers
        with stages.stage(
            "generate the chain",
            f"{o.blocks:,} blocks of {t.token_transfers + t.eth_transfers} transfers and "
            f"{t.swaps} swap on anvil, 3 ERC-20 test tokens and a token/ETH pair; ingest "
            "follows it",
        ):
            generated = await _unless_failed(
                generate_stage(devnet, o.blocks, o.transfers, ingests, console), ready
            )
            console.print(
                f"  {generated.transactions:,} transactions, "
                f"{generated.transactions / generated.seconds:,.0f} tx/s"
            )
        with stages.stage(
            "ingest",
            f"blocks 0-{generated.head} into the block database ({ingests.blocks:,} of them "
            "ingested while the chain was generated)",
        ):
            ingested = await _unless_failed(ingest_stage(ingests, generated.head, console), ready)
            console.print(
                f"  {ingested.blocks:,} blocks, {ingested.transactions:,} transactions, "
                f"{ingested.erc20_transfers:,} ERC-20 transfers, "
                f"{ingested.nft_transfers:,} NFT transfers"
            )
            assert devnet.pair is not None  # generate_stage deployed it
            await register_pair_abi(block_db, devnet.pair)
            console.print(f"  the pair's ABI registered as 'pair' for {devnet.pair}")
        waiting = time.monotonic()
        endpoints, ready_at = await ready
        console.print(
            f"\n  the cluster serves ({ready_at - cluster.started:.1f} s after its start, "
            f"waited {time.monotonic() - waiting:.1f} s for it); every RPC goes through "
            f"the proxy at unix:{endpoints['proxy_socket']}"
        )
        async with Client(
            proxy_socket=endpoints["proxy_socket"],
            bundle_coordinator=endpoints["bundle_coordinator"],
        ) as client:
            results = await _cluster_stages(
                client, job, devnet, generated.head, chain, options, stages, console
            )
    backfill, swaps, live, report, swap_check = results
    _print_figures(report, backfill, live, stages, ready_at - cluster.started, console)
    failed = backfill.failed + swaps.failed + live.failed
    for line in failed[:10]:
        console.print(f"[red]failed[/] {line[:300]}")
    ok = report.ok and swap_check.ok and not failed
    return EXIT_OK if ok else EXIT_FAILED


async def _cluster_stages(
    client: Client,
    job: ChainJob,
    devnet: Devnet,
    head: int,
    chain: dict[str, str],
    options: DemoOptions,
    stages: Stages,
    console: Console,
) -> tuple[BackfillFigures, SwapFigures, LiveFigures, Report, Check]:
    """Backfill, decoded events, live and results: the stages that run functions on
    the cluster."""
    rpc_url = chain["rpc_url"]
    block_db, sink_db = chain["block_db_url"], chain["sink_db_url"]
    o = options
    # The decoded-events task runs beside the backfill, on the same bundle cluster.
    decoded = asyncio.ensure_future(swaps_stage(client, head, o.bundle_size))
    with stages.stage(
        "backfill",
        f"blockx_drive.backfill: {job.function} per block and token through the bundle "
        f"cluster into sink table {job.sink_table!r}",
    ):
        backfill = await backfill_stage(
            client,
            job,
            0,
            head,
            block_db_url=block_db,
            sink_db_url=sink_db,
            console=console,
            tasks=o.backfill_tasks,
            tasks_in_flight=o.backfill_tasks_in_flight,
            bundle_size=o.bundle_size,
        )
        done = backfill.done
        console.print(
            f"  {done.blocks:,} blocks, {done.rows:,} rows in {done.tasks} tasks "
            f"({done.retries} retries, {done.failed} failed): "
            f"{done.blocks_per_s:,.0f} blocks/s"
        )
    with stages.stage(
        "decoded events",
        "swap over every Swap of the pair, decoded by the Worker (unit: event, ABI "
        "'pair'), one row per swap into sink table 'swaps', beside the backfill",
    ):
        swaps = await decoded
        console.print(f"  one bundle task over blocks 0-{head} in {swaps.seconds:.1f} s")
    with stages.stage(
        "live",
        f"{o.live_seconds:g} s of a block every {o.block_time_s:g} s, ingest following, "
        f"blockx_drive.follow writing each block through the block cluster, a reorg of depth "
        f"{o.reorg_depth}",
    ):
        live = await live_stage(
            client,
            job,
            devnet,
            rpc_url=rpc_url,
            block_db_url=block_db,
            sink_db_url=sink_db,
            first_block=head + 1,
            console=console,
            seconds=o.live_seconds,
            block_time_s=o.block_time_s,
            reorg_depth=o.reorg_depth,
            transfers=o.transfers,
        )
    with stages.stage("results", "read back from the sink, checked against the chain"):
        report = await build_report(job, devnet, live, block_db_url=block_db, sink_db_url=sink_db)
        assert devnet.pair is not None
        volume, swap_check = await swap_report(block_db, sink_db, devnet.pair, head)
        _print_results(report, console)
        console.print(volume)
        mark = "[green]✓[/]" if swap_check.ok else "[red]✗[/]"
        console.print(f"  {mark} {swap_check.line}")
    return backfill, swaps, live, report, swap_check


def _print_results(report: Report, console: Console) -> None:
    console.print(report.tokens)
    for check in report.checks:
        mark = "[green]✓[/]" if check.ok else "[red]✗[/]"
        console.print(f"  {mark} {check.line}")


def _print_figures(
    report: Report,
    backfill: BackfillFigures,
    live: LiveFigures,
    stages: Stages,
    cluster_ready_s: float,
    console: Console,
) -> None:
    console.print()
    figures = Table(title="figures")
    figures.add_column("what")
    figures.add_column("value", justify="right")
    done = backfill.done
    figures.add_row("backfill (blockx_drive.backfill)", f"{done.blocks_per_s:,.0f} blocks/s")
    figures.add_row("backfill rows", f"{done.rows_per_s:,.0f} rows/s")
    live_blocks = live.head - live.first_block + 1
    reorgs = ", ".join(
        f"reorg of depth {r.depth}: {len(r.rewritten)} rewritten, {len(r.deleted)} deleted"
        for r in live.reorgs
    )
    figures.add_row(
        "live blocks (blockx_drive.follow)",
        f"{live_blocks} ({live.written} writes, {live.retries} retries; {reorgs or 'no reorg'})",
    )
    lags = report.lags_ms
    figures.add_row(
        "head lag (mined → rows committed)",
        f"p50 {percentile(lags, 50)} ms, p99 {percentile(lags, 99)} ms, "
        f"max {max(lags, default=0)} ms (the sink's ledger)",
    )
    stored = live.stored_lags_ms
    figures.add_row(
        "follow: ingest stored → written",
        f"p50 {percentile(stored, 50)} ms, p99 {percentile(stored, 99)} ms (its block events)",
    )
    figures.add_row("cluster serving, from its start", f"{cluster_ready_s:.1f} s")
    for name, seconds in stages.times:
        figures.add_row(f"stage: {name}", f"{seconds:.1f} s")
    console.print(figures)
