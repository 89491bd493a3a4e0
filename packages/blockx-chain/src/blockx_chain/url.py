"""Where the block database lives: a URL in SQLAlchemy's forms.

``sqlite:////abs/path.db`` (an absolute path), ``sqlite:///rel.db`` (relative to the
working directory when it is parsed), ``postgresql://user@host:port/db`` (also
``postgres://``; a password and query options such as ``sslmode`` go to the driver).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Final

import msgspec

FORMS: Final = "sqlite:////abs/path.db, sqlite:///rel.db or postgresql://user@host:port/db"


class InvalidBlockDbUrl(ValueError):
    """The text is no block database URL; the message reads after the variable's name."""


class SqliteUrl(msgspec.Struct, frozen=True):
    path: Path


class PostgresUrl(msgspec.Struct, frozen=True):
    dsn: str
    host: str
    port: int
    database: str


BlockDbUrl = SqliteUrl | PostgresUrl


def parse_blockdb_url(raw: str, cwd: Path | None = None) -> BlockDbUrl:
    """The URL ``raw`` names; InvalidBlockDbUrl saying which form it should take."""
    text = raw.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise _invalid(raw, "no scheme")
    match scheme.lower():
        case "sqlite":
            return _sqlite(raw, rest, cwd)
        case "postgresql" | "postgres":
            return _postgres(raw, text)
        case _:
            raise _invalid(raw, f"unknown scheme {scheme!r}")


def _sqlite(raw: str, rest: str, cwd: Path | None) -> SqliteUrl:
    # sqlite:///rel.db leaves "/rel.db", sqlite:////abs.db leaves "//abs.db".
    if not rest.startswith("/"):
        raise _invalid(raw, "a SQLite URL has no host: use three slashes before the path")
    path_text = rest[1:]
    if not path_text or path_text.endswith("/") or "?" in path_text:
        raise _invalid(raw, "a SQLite URL names a database file (no query, no in-memory form)")
    path = Path(path_text)
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    return SqliteUrl(path)


def _postgres(raw: str, text: str) -> PostgresUrl:
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port or 5432
    except ValueError:
        raise _invalid(raw, "the port is not a number from 1 to 65535") from None
    database = urllib.parse.unquote(parts.path.lstrip("/"))
    if not parts.hostname:
        raise _invalid(raw, "a PostgreSQL URL needs a host")
    if not database or "/" in database:
        raise _invalid(raw, "a PostgreSQL URL needs a database name after the host")
    if parts.fragment:
        raise _invalid(raw, "a PostgreSQL URL has no #fragment")
    return PostgresUrl(dsn=text, host=parts.hostname, port=port, database=database)


def _invalid(raw: str, why: str) -> InvalidBlockDbUrl:
    return InvalidBlockDbUrl(f"must be {FORMS} ({why}: {raw!r})")


def describe(url: BlockDbUrl) -> str:
    """The URL without a password, for logs and errors."""
    match url:
        case SqliteUrl(path):
            return f"sqlite:///{path}"
        case PostgresUrl(host=host, port=port, database=database):
            return f"postgresql://{host}:{port}/{database}"


# The node's WebSocket, for ingest's newHeads subscription (``CHAIN_WS_URL``).
NO_WS: Final = "none"
WS_FORMS: Final = "a ws:// or wss:// URL, or none"


class InvalidWsUrl(ValueError):
    """The text is no WebSocket URL; the message reads after the variable's name."""


def parse_ws_url(raw: str) -> str:
    """``raw`` checked: a ``ws://``/``wss://`` URL with a host (and a port within
    range), or ``none`` (``NO_WS``: poll only); InvalidWsUrl otherwise."""
    text = raw.strip()
    if text.lower() == NO_WS:
        return NO_WS
    parts = urllib.parse.urlsplit(text)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("ws", "wss") or not parts.hostname or not port_ok:
        raise InvalidWsUrl(f"must be {WS_FORMS} (got {raw!r})")
    return text


def ws_url_of(rpc_url: str) -> str:
    """The WebSocket URL of the node at the HTTP URL ``rpc_url``: http→ws,
    https→wss, the same host, port, path and query (anvil, geth and reth serve
    both on one port when asked to)."""
    parts = urllib.parse.urlsplit(rpc_url.strip())
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme)
    if scheme is None:
        raise InvalidWsUrl(f"cannot derive a WebSocket URL from {rpc_url!r} (not http/https)")
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path, parts.query, ""))


def resolve_ws_url(ws_url: str | None, rpc_url: str) -> str | None:
    """The WebSocket to subscribe to: ``ws_url`` (checked), derived from
    ``rpc_url`` when it is None, None when it is ``none``."""
    chosen = ws_url_of(rpc_url) if ws_url is None else parse_ws_url(ws_url)
    return None if chosen == NO_WS else chosen
