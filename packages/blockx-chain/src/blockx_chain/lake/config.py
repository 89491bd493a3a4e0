"""Where a lake lives: its catalog (type, URI, warehouse, further properties), the
namespace of its tables, the SQL database of its ledger, and its read bound.

A SQL catalog (``catalog_type`` ``sql``, the default) is named by a block
database URL (``sqlite:///...`` or ``postgresql://...``, ``blockx_chain.url``):
its database also holds the ledger, the sink identity and the drivers' job
records. Any other catalog pyiceberg supports (``rest``, ``glue``, ``hive``, ...)
is given by its properties (object stores too: ``s3.endpoint`` and the like), and
then needs ``ledger_url``, the SQL database beside it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import msgspec

from blockx_chain.store import DEFAULT_MAX_ROWS
from blockx_chain.url import (
    BlockDbUrl,
    InvalidBlockDbUrl,
    PostgresUrl,
    SqliteUrl,
    parse_blockdb_url,
)

SQL: Final = "sql"
CATALOG_TYPES: Final = ("sql", "rest", "glue", "hive", "dynamodb", "bigquery")
DEFAULT_NAMESPACE: Final = "blockx"
# The catalog's name: a SQL catalog keys its tables by it.
CATALOG_NAME: Final = "blockx"
_NAMESPACE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class LakeConfigError(ValueError):
    """A lake configuration that cannot work; the message names the field
    (``uri``, ``warehouse``, ``catalog_type``, ``properties``, ``namespace``,
    ``ledger_url``, ``max_rows``) first."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class LakeConfig(msgspec.Struct, frozen=True, kw_only=True):
    uri: str
    warehouse: str | None = None
    catalog_type: str = SQL
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE
    ledger_url: str | None = None
    max_rows: int = DEFAULT_MAX_ROWS

    def ledger(self) -> BlockDbUrl:
        """The SQL database of the ledger (LakeConfigError naming the field)."""
        if self.ledger_url is not None:
            return _url("ledger_url", self.ledger_url)
        if self.catalog_type != SQL:
            raise LakeConfigError(
                "ledger_url",
                f"a {self.catalog_type} catalog keeps no ledger: name the SQL database "
                "(sqlite:///... or postgresql://...) that holds it",
            )
        return _url("uri", self.uri)

    def catalog_properties(self) -> dict[str, str]:
        """What pyiceberg's ``load_catalog`` is given (LakeConfigError naming the field)."""
        if self.catalog_type not in CATALOG_TYPES:
            raise LakeConfigError(
                "catalog_type",
                f"{self.catalog_type!r} is not one of {', '.join(CATALOG_TYPES)}",
            )
        problem = namespace_rule(self.namespace)
        if problem is not None:
            raise LakeConfigError("namespace", problem)
        if self.max_rows < 1:
            raise LakeConfigError("max_rows", f"must be >= 1, got {self.max_rows}")
        properties = {**self.properties, "type": self.catalog_type}
        if self.catalog_type == SQL:
            properties["uri"] = sqlalchemy_url(_url("uri", self.uri))
        elif self.uri:
            properties["uri"] = self.uri
        if self.warehouse is not None:
            properties["warehouse"] = warehouse_uri(self.warehouse)
        self.ledger()
        return properties


def namespace_rule(namespace: str) -> str | None:
    """Why ``namespace`` is no namespace of the lake; None when it is one."""
    if _NAMESPACE.fullmatch(namespace):
        return None
    return f"{namespace!r} is no namespace (letters, digits and underscores, at most 63)"


def _url(field: str, raw: str) -> BlockDbUrl:
    try:
        return parse_blockdb_url(raw)
    except InvalidBlockDbUrl as exc:
        raise LakeConfigError(field, str(exc)) from None


def sqlalchemy_url(url: BlockDbUrl) -> str:
    """A block database URL as SQLAlchemy names it for pyiceberg's SQL catalog."""
    match url:
        case SqliteUrl(path):
            return f"sqlite:///{path}"
        case PostgresUrl(dsn=dsn):
            return "postgresql+psycopg2://" + dsn.partition("://")[2]


def warehouse_uri(raw: str) -> str:
    """A warehouse: a URI as given (``file://``, ``s3://``, ...), a path as a
    ``file://`` URI of its absolute form."""
    if "://" in raw:
        return raw
    return Path(raw).absolute().as_uri()
