"""The worker registry: ``workers``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.text import Text

from blockx_cli.options import JsonOpt
from blockx_cli.output import EXIT_OK, Output, console
from blockx_cli.settings import settings_of
from blockx_cli.tables import Column, fitted_table
from blockx_core.registry import DEFAULT_REGISTRY_PREFIXES

if TYPE_CHECKING:
    from blockx_cli.settings import Settings

app = typer.Typer()

_COLUMNS: Final = (
    Column(header="worker", rank=0),
    Column(header="registry", rank=6),
    Column(header="slots used", rank=1),
    Column(header="cpu", rank=2),
    Column(header="mem", rank=3),
    Column(header="errors", rank=4),
    Column(header="heartbeat", rank=5),
)


@app.command()
def workers(
    ctx: typer.Context,
    *,
    prefix: Annotated[
        list[str] | None,
        typer.Option(
            help="Registry prefixes.", show_default=" and ".join(DEFAULT_REGISTRY_PREFIXES)
        ),
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """The worker registry read from etcd: slots, cpu/mem, heartbeat age.

    The table shows cpu, memory and errors as percentages of the heartbeat's
    fractions; --json gives the fractions themselves (cpu_fraction, memory_fraction,
    error_rate, each 0..1)."""
    from blockx_cli.runner import run  # the cluster's client: when the command runs

    out = Output(console, json_)
    prefixes = prefix or list(DEFAULT_REGISTRY_PREFIXES)
    raise typer.Exit(run(_workers(settings_of(ctx), out, prefixes)))


async def _workers(settings: Settings, out: Output, prefixes: list[str]) -> int:
    from blockx_cli.commands.tasks import registry_of

    found = await registry_of(settings, prefixes).workers()
    now_ms = int(time.time() * 1000)
    if out.json_mode:
        out.emit(
            [
                {
                    "worker_addr": hb.worker_addr,
                    "prefix": w.prefix,
                    "task_slots": hb.task_slots,
                    "reserved_slots": hb.reserved_slots,
                    "running_tasks": hb.running_tasks,
                    # The heartbeat's cpuPercent and memoryPercent are fractions
                    # (0..1, what the coordinator's red lines compare against):
                    # named for what they hold, not for the wire field.
                    "cpu_fraction": hb.cpu_percent,
                    "memory_fraction": hb.memory_percent,
                    "error_rate": hb.error_rate,
                    "heartbeat_age_ms": now_ms - hb.last_heartbeat_ms,
                }
                for w in found
                for hb in (w.heartbeat,)
            ]
        )
        return EXIT_OK
    rows = [
        [
            Text(hb.worker_addr),
            Text(w.prefix),
            Text(f"{_bar(hb.used_total, hb.task_slots)} {hb.used_total}/{hb.task_slots}"),
            *load_cells(hb.cpu_percent, hb.memory_percent, hb.error_rate),
            Text(f"{(now_ms - hb.last_heartbeat_ms) / 1000:.1f} s ago"),
        ]
        for w in found
        for hb in (w.heartbeat,)
    ]
    table = fitted_table(
        out.console, _COLUMNS, rows, title=f"{len(found)} worker(s) in {', '.join(prefixes)}"
    )
    out.console.print(table)
    return EXIT_OK


def load_cells(cpu: float, memory: float, errors: float) -> list[Text]:
    """A heartbeat's fractions (0..1) as ``workers`` and ``why`` both show them:
    percentages."""
    return [Text(f"{fraction:.0%}") for fraction in (cpu, memory, errors)]


def _bar(used: int, total: int, width: int = 8) -> str:
    filled = 0 if total <= 0 else round(width * min(used, total) / total)
    return "█" * filled + "·" * (width - filled)
