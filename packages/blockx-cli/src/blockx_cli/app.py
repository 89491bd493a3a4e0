"""The ``blockx`` command line (typer + rich).

Exit codes: 0 success; 1 the task or function failed (or a precheck did not pass);
2 usage: bad flags or a malformed task file; 3 the service could not be reached or
did not answer (connection, no slot within the deadline, unavailable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from blockx_cli import cluster, commands
from blockx_cli.output import EXIT_SERVICE, EXIT_USAGE, Output, fail
from blockx_client import BlockxError, Client, Cluster, TaskFileError

T = TypeVar("T")

app = typer.Typer(
    name="blockx",
    help="BlockX: run Python functions over blockchain data on a fleet of workers.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
dev = typer.Typer(help="A local cluster for development.", no_args_is_help=True)
app.add_typer(dev, name="dev")
console = Console()


class Settings:
    def __init__(
        self,
        coordinator: str | None,
        bundle_coordinator: str | None,
        sync_invoker: str | None,
        proxy: str | None,
        etcd: str,
    ) -> None:
        self.coordinator = coordinator
        self.bundle_coordinator = bundle_coordinator
        self.sync_invoker = sync_invoker
        self.proxy = proxy
        self.etcd = etcd

    def client(self) -> Client:
        return Client(
            coordinator=self.coordinator,
            bundle_coordinator=self.bundle_coordinator,
            sync_invoker=self.sync_invoker,
            proxy_socket=self.proxy,
        )


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"blockx {version('blockx-cli')}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    *,
    coordinator: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKX_COORDINATOR",
            help="Block Coordinator host:port [default: 127.0.0.1:8080].",
        ),
    ] = None,
    bundle_coordinator: Annotated[
        str | None,
        typer.Option(envvar="BLOCKX_BUNDLE_COORDINATOR", help="Bundle Coordinator host:port."),
    ] = None,
    sync_invoker: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKX_SYNC_INVOKER", help="Sync Invoker host:port [default: 127.0.0.1:9091]."
        ),
    ] = None,
    proxy: Annotated[
        str | None,
        typer.Option(
            envvar="PROXY_SOCKET_PATH", help="Send every RPC through this blockx-proxy Unix socket."
        ),
    ] = None,
    etcd: Annotated[
        str, typer.Option(envvar="ETCD_ENDPOINTS", help="etcd endpoints, for `blockx workers`.")
    ] = "localhost:2379",
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """BlockX command line."""
    ctx.obj = Settings(coordinator, bundle_coordinator, sync_invoker, proxy, etcd)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command; a BlockX error is one clear line and exit code 3, never a traceback."""
    try:
        return asyncio.run(coro)
    except TaskFileError as exc:
        fail(str(exc), EXIT_USAGE, hint="see examples/tasks/hello_world.json for the format")
    except BlockxError as exc:
        fail(exc.message, EXIT_SERVICE, hint=commands.hint_for(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _settings(ctx: typer.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ClusterOpt = Annotated[
    Cluster | None, typer.Option(case_sensitive=False, help="Override the task's cluster routing.")
]
WorkerOpt = Annotated[str, typer.Option(help="The worker's host:port.")]


@app.command()
def reserve(
    ctx: typer.Context,
    *,
    task_id: Annotated[str | None, typer.Option(help="Idempotency key [default: a uuid4].")] = None,
    cluster: Annotated[Cluster, typer.Option(case_sensitive=False)] = Cluster.BLOCK,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 30.0,
    json_: JsonOpt = False,
) -> None:
    """Reserve a slot (ReserveWorkerSlot), backing off while every worker is full."""
    out = Output(console, json_)
    _run(commands.reserve(_settings(ctx), out, task_id, cluster, timeout))


@app.command()
def submit(
    ctx: typer.Context,
    task_file: Annotated[
        Path | None, typer.Argument(help="A TaskInput JSON file (camelCase or snake_case).")
    ] = None,
    *,
    function: Annotated[str | None, typer.Option(help="CallListCallConfig: the function.")] = None,
    call: Annotated[
        list[str] | None,
        typer.Option(help="A JSON array of arguments; repeat for more calls, e.g. --call '[1]'."),
    ] = None,
    handler: Annotated[
        str, typer.Option(help="Result handler type ('' for none).")
    ] = "ReturnValueResultHandler",
    task_id: Annotated[str | None, typer.Option(help="Idempotency key [default: a uuid4].")] = None,
    timeout_ms: Annotated[int, typer.Option(help="task_timeout_ms (0 = the worker default).")] = 0,
    cluster: ClusterOpt = None,
    worker: Annotated[
        str | None, typer.Option(help="Submit straight to this worker (it reserves inline).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Watch the task to its end.")] = False,
    deadline: Annotated[float | None, typer.Option(help="Seconds to wait for a slot.")] = None,
    json_: JsonOpt = False,
) -> None:
    """Submit a task from a JSON file or from --function/--call; --wait to see its end."""
    out = Output(console, json_)
    task = commands.build_task(task_file, function, call, handler, task_id, timeout_ms)
    code = _run(commands.submit(_settings(ctx), out, task, cluster, worker, wait, deadline))
    raise typer.Exit(code)


@app.command()
def watch(
    ctx: typer.Context,
    task_ids: Annotated[list[str], typer.Argument(help="Task ids on that worker.")],
    *,
    worker: WorkerOpt,
    json_: JsonOpt = False,
) -> None:
    """Watch tasks to their end: a live table with states, progress and totals."""
    out = Output(console, json_)
    raise typer.Exit(_run(commands.watch(_settings(ctx), out, task_ids, worker)))


@app.command("get-result")
def get_result(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument()],
    *,
    worker: WorkerOpt,
    json_: JsonOpt = False,
) -> None:
    """A task's state and result (kept RESULT_RETENTION_MS after it ends)."""
    out = Output(console, json_)
    raise typer.Exit(_run(commands.get_result(_settings(ctx), out, task_id, worker)))


@app.command()
def invoke(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    debug: Annotated[bool, typer.Option("--debug", help="Also show output and IO trace.")] = False,
    timeout_ms: Annotated[int, typer.Option(help="Call budget (0 = default).")] = 0,
    json_: JsonOpt = False,
) -> None:
    """Run one function once through the Sync Invoker."""
    out = Output(console, json_)
    values = commands.parse_args(args or [])
    raise typer.Exit(
        _run(commands.invoke(_settings(ctx), out, function, values, debug, timeout_ms))
    )


@app.command()
def precheck(
    ctx: typer.Context,
    function: Annotated[str, typer.Argument()],
    args: Annotated[list[str] | None, typer.Argument(help="Arguments, each a JSON value.")] = None,
    *,
    json_: JsonOpt = False,
) -> None:
    """Check a function compiles and accepts the arguments, without running it."""
    out = Output(console, json_)
    values = commands.parse_args(args or [])
    raise typer.Exit(
        _run(commands.precheck(_settings(ctx), out, function, values, args is not None))
    )


@app.command()
def workers(
    ctx: typer.Context,
    *,
    prefix: Annotated[
        list[str] | None, typer.Option(help="Registry prefixes [default: block and bundle].")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """The worker registry read from etcd: slots, cpu/mem, heartbeat age."""
    out = Output(console, json_)
    prefixes = prefix or ["/blockx/workers/", "/blockx/bundle-workers/"]
    raise typer.Exit(_run(commands.workers(_settings(ctx), out, prefixes)))


@dev.command("up")
def dev_up(
    *,
    coordinator_port: Annotated[int, typer.Option()] = 8080,
    worker_port: Annotated[int, typer.Option()] = 9090,
    sync_invoker_port: Annotated[int, typer.Option()] = 9091,
    metrics_port: Annotated[int, typer.Option()] = 9100,
    executors: Annotated[int, typer.Option()] = 2,
    examples: Annotated[Path, typer.Option(help="Functions and tasks to use.")] = Path("examples"),
) -> None:
    """etcd, a coordinator, a worker with executors, the sync invoker and the proxy,
    in the foreground until Ctrl-C."""
    cluster.dev_up(
        coordinator_port, worker_port, sync_invoker_port, metrics_port, executors, examples
    )


@app.command()
def demo(
    *,
    tasks: Annotated[int, typer.Option(help="How many tasks.")] = 24,
    blocks: Annotated[int, typer.Option(help="Blocks per task (one call each).")] = 50,
    examples: Annotated[Path, typer.Option(help="Functions and tasks to use.")] = Path("examples"),
) -> None:
    """Start a local cluster, run block-statistics tasks on it, watch them live, print
    the results, and shut everything down."""
    raise typer.Exit(cluster.demo(tasks, blocks, examples, console))


@app.command()
def version_info() -> None:
    """Print the versions of the installed BlockX packages."""
    from importlib.metadata import PackageNotFoundError, version

    for package in ("blockx-cli", "blockx-client", "blockx-proto", "blockx-server"):
        try:
            console.print(f"{package} {version(package)}")
        except PackageNotFoundError:
            console.print(f"{package} (not installed)")


def main() -> None:
    app()
