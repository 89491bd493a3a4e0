"""Where the CLI finds a database: a flag (or its environment variable, which
typer reads), else the running ``blockx dev up``'s dev.toml.

``blockx backfill``, ``blockx follow``, ``blockx jobs`` and ``blockx dashboard``
resolve ``--db`` / BLOCKDB_URL and ``--sink-db`` / SINK_DB_URL the same way."""

from __future__ import annotations

from typing import Annotated

import typer

from blockx_chain.url import BlockDbUrl, InvalidBlockDbUrl, parse_blockdb_url
from blockx_cli.output import EXIT_USAGE, fail

URL_FORMS = "sqlite:////abs.db, sqlite:///rel.db or postgresql://user@host:port/db"
# The sink whose job records ``blockx jobs`` and the dashboard read.
SinkDbOpt = Annotated[
    str | None,
    typer.Option(
        "--sink-db",
        envvar="SINK_DB_URL",
        help=f"The sink database the jobs write, whose job records are read: {URL_FORMS} "
        "(default: SINK_DB_URL, else the running `blockx dev up`'s).",
    ),
]


def find_database(raw: str | None, flag: str, variable: str) -> tuple[BlockDbUrl, bool] | None:
    """The database of ``flag`` (or of its environment variable ``variable``), else
    the one the running ``blockx dev up`` wrote into dev.toml, and whether it came
    from dev.toml; None when none is named. A malformed URL exits 2 naming where
    it came from."""
    from blockx_client import InvalidRequestError  # dev.toml's reader: when it is read
    from blockx_client.dev_config import dev_config_path, read_dev_config

    source, from_dev = flag, False
    if not raw:
        try:
            raw = read_dev_config().get(variable)
        except InvalidRequestError as exc:
            fail(exc.message, EXIT_USAGE)
        source, from_dev = f"{variable} in {dev_config_path()}", True
    if not raw:
        return None
    try:
        return parse_blockdb_url(raw), from_dev
    except InvalidBlockDbUrl as exc:
        fail(f"{source} {exc}", EXIT_USAGE)


def database_url(raw: str | None, flag: str, variable: str, what: str) -> tuple[BlockDbUrl, bool]:
    """``find_database``, exiting 2 when none is named."""
    found = find_database(raw, flag, variable)
    if found is None:
        fail(f"no {what}: pass {flag}, set {variable}, or start `blockx dev up`", EXIT_USAGE)
    return found
