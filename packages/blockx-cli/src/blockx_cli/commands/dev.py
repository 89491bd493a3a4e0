"""The local cluster: ``dev up`` and ``demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from blockx_cli.devcluster import LaunchOptions
from blockx_cli.devcluster.demo import demo as run_demo
from blockx_cli.devcluster.program import launch
from blockx_cli.output import EXIT_USAGE, console, fail

# ``blockx dev ...``
group = typer.Typer(help="A local cluster for development.", no_args_is_help=True)
# Top-level commands.
app = typer.Typer()

ExamplesOpt = Annotated[Path, typer.Option(help="Functions and tasks to use.")]


def _examples(examples: Path) -> Path:
    if not (examples / "functions").is_dir():
        fail(
            f"{examples} has no functions/ directory",
            EXIT_USAGE,
            hint="run from the repository root, or pass --examples",
        )
    return examples.resolve()


@group.command("up")
def dev_up(
    *,
    coordinator_port: Annotated[int, typer.Option()] = 8080,
    worker_port: Annotated[int, typer.Option()] = 9090,
    sync_invoker_port: Annotated[int, typer.Option()] = 9091,
    metrics_port: Annotated[int, typer.Option()] = 9100,
    executors: Annotated[int, typer.Option()] = 2,
    examples: ExamplesOpt = Path("examples"),
) -> None:
    """etcd, a coordinator, a worker with executors, the sync invoker and the proxy,
    in the foreground until Ctrl-C."""
    launch(
        LaunchOptions(
            coordinator_port=coordinator_port,
            worker_port=worker_port,
            sync_invoker_port=sync_invoker_port,
            metrics_port=metrics_port,
            executors=executors,
            examples=_examples(examples),
        )
    )


@app.command()
def demo(
    *,
    tasks: Annotated[int, typer.Option(help="How many tasks.")] = 24,
    blocks: Annotated[int, typer.Option(help="Blocks per task (one call each).")] = 50,
    examples: ExamplesOpt = Path("examples"),
) -> None:
    """Start a local cluster, run block-statistics tasks on it, watch them live, print
    the results, and shut everything down."""
    if tasks < 1 or blocks < 1:
        fail("--tasks and --blocks must be at least 1", EXIT_USAGE)
    raise typer.Exit(run_demo(tasks, blocks, _examples(examples), console))
