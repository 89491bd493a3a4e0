"""Placement explanations: ``why``."""

from __future__ import annotations

from typing import Annotated

import msgspec
import typer
from rich.table import Table
from rich.text import Text

from blockx_cli.addresses import host_port_option
from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_OK, Output, console
from blockx_cli.runner import run
from blockx_cli.settings import Settings, settings_of
from blockx_client import Cluster, PlacementReport

app = typer.Typer()

_COLUMNS = ("worker", "eligible", "reason", "slots used", "cpu", "mem", "errors", "heartbeat")
_REFUSAL_COLUMNS = ("when", "task", "code", "explanation")


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
    heartbeat, red lines, breaker, full)."""
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
    out.console.print(_table(report))
    if not report.view_trusted:
        out.console.print(
            f"[bold red]the coordinator does not place now:[/] {report.not_ready_reason}",
            highlight=False,
        )
    if refusals and report.recent_refusals:
        out.console.print(_refusals(report, refusals))
    return EXIT_OK


def _table(report: PlacementReport) -> Table:
    table = Table(
        title=f"{len(report.eligible)} of {len(report.workers)} worker(s) eligible "
        f"at {report.coordinator}",
        caption="eligible workers first, in the order the coordinator picks them",
    )
    for column in _COLUMNS:
        table.add_column(column, no_wrap=column != "reason")
    for w in report.workers:
        table.add_row(
            Text(w.worker_addr),
            "[green]yes[/]" if w.eligible else "[red]no[/]",
            Text(w.reason),
            f"{w.used_slots}/{w.task_slots}",
            f"{w.cpu_fraction:.2f}",
            f"{w.memory_fraction:.2f}",
            f"{w.error_rate:.2f}",
            f"{w.heartbeat_age_ms / 1000:.1f} s ago",
        )
    return table


def _refusals(report: PlacementReport, limit: int) -> Table:
    shown = report.recent_refusals[:limit]
    more = len(report.recent_refusals) - len(shown)
    table = Table(
        title=f"the coordinator's last {len(shown)} refusal(s)",
        caption=f"+{more} older (--refusals 20 shows them)" if more else None,
    )
    for column in _REFUSAL_COLUMNS:
        table.add_column(column, no_wrap=column != "explanation")
    for r in shown:
        table.add_row(
            f"{max(0, report.now_ms - r.at_ms) / 1000:.1f} s ago",
            Text(r.task_id),
            r.code,
            Text(r.message),
        )
    return table
