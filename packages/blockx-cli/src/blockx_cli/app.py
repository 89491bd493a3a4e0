"""The ``blockx`` command line (typer + rich).

This module declares the root options and merges the command modules of
``blockx_cli.commands``, one per noun; the root options reach the commands through
``blockx_cli.settings``.

Exit codes: 0 success; 1 the task or function failed (or a precheck did not pass);
2 usage: bad flags or a malformed task file; 3 the service could not be reached or
did not answer (connection, no slot within the deadline, unavailable).
"""

from __future__ import annotations

from typing import Annotated

import typer

from blockx_cli.addresses import etcd_endpoints_option, host_port_option, unix_socket_option
from blockx_cli.commands import (
    chain,
    code,
    dashboard,
    dev,
    drive,
    function,
    jobs,
    replay,
    task,
    tasks,
    version,
    why,
    workers,
)
from blockx_cli.settings import CURRENT, FLAGS, Settings
from blockx_client.client import DEFAULT_COORDINATOR, DEFAULT_SYNC_INVOKER

app = typer.Typer(
    name="blockx",
    help="BlockX: run Python functions over blockchain data on a fleet of workers.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for commands in (
    task.app,
    tasks.app,
    function.app,
    replay.app,
    workers.app,
    why.app,
    dashboard.app,
    dev.app,
    drive.app,
    jobs.app,
    code.app,
    version.app,
):
    app.add_typer(commands)
app.add_typer(dev.group, name="dev")
app.add_typer(chain.group, name="chain")


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
            callback=version.print_version,
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


def main() -> None:
    app()
