"""Placement explanations: ``why``."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from blockx_cli.addresses import host_port_option
from blockx_cli.commands.workers import load_cells
from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_OK, Output, console
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of
from blockx_cli.tables import Column, fitted_table
from blockx_client import Cluster, PlacementReport

app = typer.Typer()

_COLUMNS: Final = (
    Column(header="worker", rank=0),
    Column(header="eligible", rank=0),
    Column(header="reason", rank=1, narrowest=20),
    Column(header="slots used", rank=2),
    Column(header="cpu", rank=3),
    Column(header="mem", rank=4),
    Column(header="errors", rank=5),
    Column(header="heartbeat", rank=6),
)
_REFUSAL_COLUMNS: Final = (
    Column(header="when", rank=1),
    Column(header="task", rank=0),
    Column(header="code", rank=0),
    Column(header="explanation", rank=0, narrowest=20),
)


@app.command()
def why(
    ctx: typer.Context,
    *,
    worker: Annotated[
        str | None,
        typer.Option(
            callback=host_port_option,
            help="Only this worker's host:port.",
            show_default="every worker",
        ),
    ] = None,
    cluster: Annotated[
        Cluster,
        typer.Option(case_sensitive=False, help="Whose coordinator to ask."),
    ] = Cluster.BLOCK,
    refusals: Annotated[
        int,
        typer.Option(
            min=0,
            max=20,
            help="Also list the coordinator's last refusals, newest first (0: none).",
        ),
    ] = 5,
    json_: JsonOpt = False,
) -> None:
    """Why a task is (or is not) placed: each worker's eligibility, as the block
    (or, with --cluster bundle, the bundle) coordinator judges it now (stale
    heartbeat, red lines, breaker, full).

    The table shows cpu, memory and errors as percentages, as `blockx workers`
    does; --json gives the fractions (cpu_fraction, memory_fraction, error_rate,
    each 0..1)."""
    out = Output(console, json_)
    raise typer.Exit(run(_why(settings_of(ctx), out, worker, cluster, refusals)))


async def _why(
    settings: Settings, out: Output, worker: str | None, cluster: Cluster, refusals: int
) -> int:
    async with settings.client() as client:
        report = await client.explain_placement(worker, cluster=cluster)
    if out.json_mode:
        out.emit(
            {
                "cluster": cluster.value,
                "coordinator": report.coordinator,
                "view_trusted": report.view_trusted,
                "not_ready_reason": report.not_ready_reason,
                "now_ms": report.now_ms,
                "workers": [msgspec.to_builtins(w) for w in report.workers],
                "recent_refusals": [
                    msgspec.to_builtins(r) for r in report.recent_refusals[:refusals]
                ],
            }
        )
        return EXIT_OK
    out.console.print(_table(report, out.console))
    if not report.view_trusted:
        out.console.print(
            f"[bold red]the coordinator does not place now:[/] {report.not_ready_reason}",
            highlight=False,
        )
    if refusals and report.recent_refusals:
        out.console.print(_refusals(report, refusals, out.console))
    return EXIT_OK


def _table(report: PlacementReport, console: Console) -> Table:
    rows = [
        [
            Text(w.worker_addr),
            Text("yes", style="green") if w.eligible else Text("no", style="red"),
            Text(w.reason),
            Text(f"{w.used_slots}/{w.task_slots}"),
            *load_cells(w.cpu_fraction, w.memory_fraction, w.error_rate),
            Text(f"{w.heartbeat_age_ms / 1000:.1f} s ago"),
        ]
        for w in report.workers
    ]
    return fitted_table(
        console,
        _COLUMNS,
        rows,
        title=f"{len(report.eligible)} of {len(report.workers)} worker(s) eligible "
        f"at {report.coordinator}",
        caption="eligible workers first, in the order the coordinator picks them",
    )


def _refusals(report: PlacementReport, limit: int, console: Console) -> Table:
    shown = report.recent_refusals[:limit]
    more = len(report.recent_refusals) - len(shown)
    rows = [
        [
            Text(f"{max(0, report.now_ms - r.at_ms) / 1000:.1f} s ago"),
            Text(r.task_id),
            Text(r.code),
            Text(r.message),
        ]
        for r in shown
    ]
    return fitted_table(
        console,
        _REFUSAL_COLUMNS,
        rows,
        title=f"the coordinator's last {len(shown)} refusal(s)",
        caption=f"+{more} older (--refusals 20 shows them)" if more else None,
    )
