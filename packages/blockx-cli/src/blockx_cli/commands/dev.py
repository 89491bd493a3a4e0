"""The local cluster: ``dev up`` and ``demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from blockx_cli.output import EXIT_USAGE, console, fail

# The launcher (and with it the chain package, the node's client and the database
# drivers) is imported by the commands that run it, not by every `blockx` command.

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


PortOpt = Annotated[
    int | None, typer.Option(help="Fixed port; unset: a free one.", show_default=False)
]


@group.command("up")
def dev_up(
    *,
    functions: Annotated[
        Path | None,
        typer.Option(
            help="The function modules to serve; unset: FUNCTIONS_DIR, else EXAMPLES/functions.",
            show_default=False,
        ),
    ] = None,
    examples: Annotated[
        Path | None,
        typer.Option(
            help="functions/, and when present memory_seed.json and tasks/hello_world.json "
            "(the smoke task); unset: examples.",
            show_default=False,
        ),
    ] = None,
    coordinator_port: PortOpt = None,
    bundle_coordinator_port: PortOpt = None,
    worker_port: PortOpt = None,
    bundle_worker_port: PortOpt = None,
    sync_invoker_port: PortOpt = None,
    metrics_port: PortOpt = None,
    anvil_port: PortOpt = None,
    dashboard_port: PortOpt = None,
    executors: Annotated[int, typer.Option()] = 2,
    blocks: Annotated[int, typer.Option(min=0, help="Blocks of history to mine.")] = 200,
    block_time: Annotated[
        float, typer.Option(min=0, help="Seconds between live blocks; 0: none.")
    ] = 2.0,
    chain: Annotated[
        bool, typer.Option(help="Run anvil, the databases and the bundle cluster.")
    ] = True,
    smoke: Annotated[
        bool, typer.Option(help="Run the example smoke task once everything serves.")
    ] = True,
    dashboard: Annotated[
        bool, typer.Option(help="Run the read-only web dashboard (blockx dashboard).")
    ] = True,
) -> None:
    """etcd, the block and bundle coordinators and workers, the sync invoker, the proxy,
    and a chain: anvil with test tokens and live blocks, a block database kept fresh
    by a following ingest, a sink database; and the web dashboard; in the
    foreground until Ctrl-C.

    Every port is a free one unless an option fixes it. While it runs, the addresses,
    the proxy's socket and the chain's node and databases are in
    ~/.config/blockx/dev.toml ($XDG_CONFIG_HOME/blockx/dev.toml), which blockx and
    blockx_client read in any shell (flags and environment variables win): every RPC
    then goes through its proxy (blockx --direct: not). One runs at a time: a second
    is refused, naming the first one's pid."""
    from blockx_cli.devcluster import LaunchOptions
    from blockx_cli.devcluster.chain import ChainOptions
    from blockx_cli.devcluster.layout import find_layout
    from blockx_cli.devcluster.processes import LaunchError
    from blockx_cli.devcluster.program import launch

    try:
        layout = find_layout(functions=functions, examples=examples)
    except LaunchError as exc:
        fail(str(exc), EXIT_USAGE, hint="pass --functions DIR, or run from the repository root")
    launch(
        LaunchOptions(
            layout=layout,
            coordinator_port=coordinator_port,
            bundle_coordinator_port=bundle_coordinator_port,
            worker_port=worker_port,
            bundle_worker_port=bundle_worker_port,
            sync_invoker_port=sync_invoker_port,
            metrics_port=metrics_port,
            executors=executors,
            dashboard=dashboard,
            dashboard_port=dashboard_port,
            chain=ChainOptions(
                anvil_port=anvil_port, history_blocks=blocks, block_time_s=block_time
            )
            if chain
            else None,
        ),
        smoke=smoke,
    )


@app.command()
def demo(
    *,
    blocks: Annotated[int, typer.Option(min=1, help="Blocks of history to generate.")] = 1500,
    live_seconds: Annotated[
        float, typer.Option(min=3, help="How long the live stage mines (a reorg part-way).")
    ] = 5.0,
    examples: ExamplesOpt = Path("examples"),
) -> None:
    """Start a local cluster with anvil, generate a chain of ERC-20 transfers, ingest
    it, backfill token volume through the bundle cluster, go live through a reorg,
    print the results read back from the sink, and shut everything down."""
    from blockx_cli.devcluster.demo import DemoOptions
    from blockx_cli.devcluster.demo import demo as run_demo

    options = DemoOptions(blocks=blocks, live_seconds=live_seconds)
    raise typer.Exit(run_demo(options, _examples(examples), console))
