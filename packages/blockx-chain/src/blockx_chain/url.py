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
