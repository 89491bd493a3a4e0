"""The ``blockx`` command line (typer + rich).

This module declares the root options and the commands of ``blockx_cli.commands``,
one module per noun; the root options reach the commands through
``blockx_cli.settings``. A command's module is imported when the command runs or
shows its help: ``blockx --help`` lists every command from ``COMMANDS``, a table of
names and short helps (a test keeps it equal to the commands themselves), and
``blockx --version`` imports none of them.

Exit codes: 0 success; 1 the task or function failed (or a precheck did not pass);
2 usage: bad flags or a malformed task file; 3 the service could not be reached or
did not answer (connection, no slot within the deadline, unavailable).
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, Final, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

from blockx_cli.addresses import etcd_endpoints_option, host_port_option, unix_socket_option
from blockx_cli.commands.version import print_version
from blockx_cli.settings import CURRENT, FLAGS, Settings

# ``blockx_client.client``'s defaults, as the root help shows them (a test keeps
# them equal): importing the client costs a command that does not dial anything.
DEFAULT_COORDINATOR: Final = "127.0.0.1:8080"
DEFAULT_SYNC_INVOKER: Final = "127.0.0.1:9091"


class Entry(NamedTuple):
    """A command of the root: its name, the module and attribute of the ``typer.Typer``
    that declares it (a group when ``group``, else one of its commands), and the first
    paragraph of its help, which ``blockx --help`` lists without importing the module
    (a test keeps it equal to the command's own)."""

    name: str
    module: str
    attribute: str
    group: bool
    short_help: str


COMMANDS: Final = (
    Entry(
        "reserve",
        "task",
        "app",
        False,
        "Reserve a slot (ReserveWorkerSlot), backing off while every worker is full.",
    ),
    Entry(
        "submit",
        "task",
        "app",
        False,
        "Submit a task from a JSON file or from --function/--call; --wait to see its end.",
    ),
    Entry(
        "watch",
        "task",
        "app",
        False,
        "Watch tasks to their end: a live table with states, calls done and totals.",
    ),
    Entry(
        "get-result",
        "task",
        "app",
        False,
        "A task's state and result (kept RESULT_RETENTION_MS after it ends).",
    ),
    Entry(
        "cancel",
        "task",
        "app",
        False,
        "Cancel a task: a running one stops (its calls are cancelled, its writer skipped)\n"
        "and ends FAILED CANCELLED, not retryable, so backfill and follow never run it\n"
        "again. A writer already writing finishes; a finished task shows its state.",
    ),
    Entry(
        "tasks",
        "tasks",
        "app",
        False,
        "The tasks of every registered worker: reserved, running and retained results;\n"
        "with --state failed also the failures whose results expired (marked expired).",
    ),
    Entry("invoke", "function", "app", False, "Run one function once through the Sync Invoker."),
    Entry(
        "precheck",
        "function",
        "app",
        False,
        "Check a function compiles and accepts the arguments, without calling it.",
    ),
    Entry(
        "replay",
        "replay",
        "app",
        False,
        "Run a recorded call again here, in a real executor, with the IO answers it got:\n"
        "a failed call shows the same exception at the same line.",
    ),
    Entry(
        "workers",
        "workers",
        "app",
        False,
        "The worker registry read from etcd: slots, cpu/mem, heartbeat age.",
    ),
    Entry(
        "why",
        "why",
        "app",
        False,
        "Why a task is (or is not) placed: each worker's eligibility, as the block\n"
        "(or, with --cluster bundle, the bundle) coordinator judges it now (stale\n"
        "heartbeat, red lines, breaker, full).",
    ),
    Entry(
        "dashboard",
        "dashboard",
        "app",
        False,
        "A read-only web dashboard of the cluster: workers, tasks (search by id), each\n"
        "task's phases and failures, backfill and follow jobs, placement.",
    ),
    Entry(
        "demo",
        "dev",
        "app",
        False,
        "Start a local cluster with anvil, generate a chain of ERC-20 transfers, ingest\n"
        "it, backfill token volume through the bundle cluster, go live through a reorg,\n"
        "print the results read back from the sink, and shut everything down.",
    ),
    Entry(
        "backfill",
        "drive",
        "app",
        False,
        "Run a block range through the bundle cluster into a sink table, resumably.",
    ),
    Entry(
        "follow",
        "drive",
        "app",
        False,
        "Compute every new block on the block cluster into a sink table, reorgs included,\n"
        "until SIGINT/SIGTERM.",
    ),
    Entry(
        "jobs",
        "jobs",
        "app",
        False,
        "Backfill and follow jobs, from their records in the sink database: state,\n"
        "progress, blocks/s, lag, last failures, the command that started each.",
    ),
    Entry(
        "code",
        "code",
        "app",
        False,
        "The exact code that wrote a block's rows of a sink table: the task that\n"
        "wrote them, its code epoch, the digest of its module set and every module's\n"
        "source, from the sink itself.",
    ),
    Entry(
        "version-info",
        "version",
        "app",
        False,
        "Print the versions of the installed BlockX packages.",
    ),
    Entry("dev", "dev", "group", True, "A local cluster for development."),
    Entry("chain", "chain", "group", True, "Chain data: the block database and a local devnet."),
)


def load(entry: Entry, *, rich_markup_mode: Any = "rich") -> TyperCommand | TyperGroup:
    """The command ``entry`` names, built as ``add_typer`` on the root builds it."""
    module = importlib.import_module(f"blockx_cli.commands.{entry.module}")
    holder = typer.Typer(rich_markup_mode=rich_markup_mode)
    holder.add_typer(getattr(module, entry.attribute), name=entry.name if entry.group else None)
    command = typer.main.get_group(holder).commands[entry.name]
    assert isinstance(command, TyperCommand | TyperGroup)
    return command


class LazyGroup(TyperGroup):
    """A group whose commands (``entries``) are imported when one is run or its help
    shown: the group's own help lists them from their short helps alone."""

    entries: tuple[Entry, ...] = COMMANDS

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        self._unloaded = {e.name: e for e in self.entries if e.name not in self.commands}
        placeholders: dict[str, TyperCommand | TyperGroup] = {
            e.name: (TyperGroup if e.group else TyperCommand)(name=e.name, help=e.short_help)
            for e in self.entries
        }
        self.commands = {**placeholders, **self.commands}

    # ``ctx`` is typer's vendored click Context, which typer does not name publicly.
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = None if self._listing else self._unloaded.pop(cmd_name, None)
        if entry is not None:
            self.commands[cmd_name] = load(entry, rich_markup_mode=self.rich_markup_mode)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    cls=LazyGroup,
    name="blockx",
    help="BlockX: run Python functions over blockchain data on a fleet of workers.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    *,
    coordinator: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKX_COORDINATOR",
            callback=host_port_option,
            help="Block Coordinator host:port.",
            show_default=DEFAULT_COORDINATOR,
        ),
    ] = None,
    bundle_coordinator: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKX_BUNDLE_COORDINATOR",
            callback=host_port_option,
            help="Bundle Coordinator host:port.",
        ),
    ] = None,
    sync_invoker: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKX_SYNC_INVOKER",
            callback=host_port_option,
            help="Sync Invoker host:port.",
            show_default=DEFAULT_SYNC_INVOKER,
        ),
    ] = None,
    proxy: Annotated[
        str | None,
        typer.Option(
            envvar="PROXY_SOCKET_PATH",
            callback=unix_socket_option,
            help="Send every RPC through this blockx-proxy Unix socket (PATH or unix:PATH).",
            show_default="the running dev up's proxy, unless an address is given",
        ),
    ] = None,
    direct: Annotated[
        bool,
        typer.Option(
            "--direct",
            help="Dial the coordinators, workers and sync invoker directly: no proxy, "
            "whatever --proxy, PROXY_SOCKET_PATH or dev.toml say.",
        ),
    ] = False,
    etcd: Annotated[
        str | None,
        typer.Option(
            envvar="ETCD_ENDPOINTS",
            callback=etcd_endpoints_option,
            help="etcd endpoints (comma-separated host:port): the worker registry that "
            "`workers`, `tasks` and `dashboard` read, and where `watch`, `get-result` and "
            "`cancel` find a task's worker (without --worker).",
            show_default="the running dev up's, else localhost:2379",
        ),
    ] = None,
    etcd_ca_file: Annotated[
        str | None,
        typer.Option(envvar="ETCD_CA_FILE", help="CA of etcd's certificate: dial etcd over TLS."),
    ] = None,
    etcd_cert_file: Annotated[
        str | None,
        typer.Option(envvar="ETCD_CERT_FILE", help="Client certificate for etcd (PEM)."),
    ] = None,
    etcd_key_file: Annotated[
        str | None, typer.Option(envvar="ETCD_KEY_FILE", help="Key of --etcd-cert-file (PEM).")
    ] = None,
    etcd_username: Annotated[
        str | None,
        typer.Option(
            envvar="ETCD_USERNAME", help="etcd user; its password is read from ETCD_PASSWORD."
        ),
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """BlockX command line."""
    ctx.obj = settings = Settings(
        coordinator,
        bundle_coordinator,
        sync_invoker,
        proxy,
        etcd,
        etcd_files=(etcd_ca_file, etcd_cert_file, etcd_key_file),
        etcd_username=etcd_username,
        direct=direct,
        from_environment=_read_from_environment(ctx),
    )
    CURRENT.set(settings)


def _read_from_environment(ctx: typer.Context) -> list[str]:
    """The address variables whose value typer took from the environment."""
    sources = {
        variable: ctx.get_parameter_source(flag.removeprefix("--").replace("-", "_"))
        for variable, flag in FLAGS.items()
    }
    return [v for v, source in sources.items() if source and source.name == "ENVIRONMENT"]


class _ChainOnly(LazyGroup):
    entries = tuple(e for e in COMMANDS if e.name == "chain")


# ``blockx chain ...`` as ``launch`` runs it: the chain group without the root options.
chain_only = typer.Typer(
    cls=_ChainOnly, name="blockx", rich_markup_mode="rich", pretty_exceptions_enable=False
)


@chain_only.callback()
def _chain_root() -> None:
    # No options and no help of its own (a docstring would be both): a group needs a
    # callback to be one when its only command is lazy.
    pass


def main() -> None:
    app()
