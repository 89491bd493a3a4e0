"""The web dashboard: ``dashboard``."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from blockx_cli.dashboard.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_REFRESH_S,
    DEFAULT_TIMEOUT_S,
    LOOPBACK_NAMES,
    DashboardConfig,
)
from blockx_cli.databases import SinkDbOpt, find_database
from blockx_cli.output import EXIT_SERVICE, EXIT_USAGE, console, fail
from blockx_cli.settings import settings_of
from blockx_client import BlockxError
from blockx_core.registry import DEFAULT_REGISTRY_PREFIXES
from blockx_drive.submission import url_text

app = typer.Typer()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def dashboard(
    ctx: typer.Context,
    *,
    host: Annotated[
        str,
        typer.Option(
            envvar="BLOCKX_DASHBOARD_HOST",
            help="Address to listen on. It has no login: keep it on loopback unless "
            "you mean everyone who can reach the host to read it.",
        ),
    ] = DEFAULT_HOST,
    port: Annotated[
        int,
        typer.Option(
            envvar="BLOCKX_DASHBOARD_PORT",
            min=0,
            max=65535,
            help="Port to listen on; 0: a free one.",
        ),
    ] = DEFAULT_PORT,
    prefix: Annotated[
        list[str] | None,
        typer.Option(
            help="Worker registry prefixes; repeat for more.",
            show_default=" and ".join(DEFAULT_REGISTRY_PREFIXES),
        ),
    ] = None,
    sink_db: SinkDbOpt = None,
    blockdb: Annotated[
        str | None,
        typer.Option(
            "--blockdb",
            envvar="BLOCKDB_URL",
            help="The block database whose head and kind (whole blocks, or the logs of "
            "a filter) the Jobs page shows (default: BLOCKDB_URL, else the running "
            "`blockx dev up`'s).",
        ),
    ] = None,
    refresh: Annotated[
        float, typer.Option(min=0, help="Seconds between a page's data reloads; 0: never.")
    ] = DEFAULT_REFRESH_S,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds etcd, each worker and the coordinator have to answer."),
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """A read-only web dashboard of the cluster: workers, tasks (search by id), each
    task's phases and failures, backfill and follow jobs, placement.

    It reads etcd (--etcd / ETCD_ENDPOINTS), the registered workers and the block
    coordinator (--coordinator / BLOCKX_COORDINATOR), like `blockx workers`,
    `blockx tasks` and `blockx why`, and the job records in the sink database
    (--sink-db / SINK_DB_URL), like `blockx jobs`; it changes nothing (GET and
    HEAD only)."""
    settings = settings_of(ctx)
    sink = find_database(sink_db, "--sink-db", "SINK_DB_URL")
    block_db = find_database(blockdb, "--blockdb", "BLOCKDB_URL")
    try:
        config = DashboardConfig(
            etcd_endpoints=tuple(settings.etcd_endpoints()),
            prefixes=tuple(prefix or DEFAULT_REGISTRY_PREFIXES),
            sink_db_url=None if sink is None else url_text(sink[0]),
            blockdb_url=None if block_db is None else url_text(block_db[0]),
            coordinator=settings.coordinator,
            bundle_coordinator=settings.bundle_coordinator,
            proxy_socket=settings.proxy,
            direct=settings.direct,
            access=settings.etcd_access(),
            refresh_s=refresh,
            timeout_s=timeout,
            # On loopback, only requests addressed to loopback (no DNS rebinding).
            allowed_hosts=(*LOOPBACK_NAMES, host) if _loopback(host) else (),
        )
    except BlockxError as exc:
        fail(exc.message, EXIT_USAGE)
    if not _loopback(host):
        console.print(
            f"[yellow]listening on {host}: anyone who can reach it can read the dashboard "
            "(it has no login)[/]",
            highlight=False,
        )

    def listening(url: str) -> None:
        console.print(f"BlockX dashboard on {url} (read-only; Ctrl-C to stop)", highlight=False)

    # Here, not at the top: the web stack loads only for this command.
    from blockx_cli.dashboard.server import BindError, serve

    try:
        serve(config, host, port, on_listening=listening)
    except BindError as exc:
        fail(str(exc), EXIT_SERVICE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
