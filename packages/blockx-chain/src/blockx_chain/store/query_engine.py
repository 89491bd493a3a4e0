"""The runner of checked statements (``query.prepare``) for each engine of the
block database: read-only connections to a SQLite file, or PostgreSQL as a
read-only role."""

from __future__ import annotations

from typing import Any, Protocol

from blockx_chain.store.query import QueryLimits, Statement
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl


class QueryEngine(Protocol):
    """One engine's runner of checked statements."""

    async def query(self, statement: Statement) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


async def open_queries(
    url: BlockDbUrl, executor_url: PostgresUrl | None, limits: QueryLimits
) -> QueryEngine:
    """The runner of statements over the block database at ``url``: a SQLite file
    read through read-only connections, or PostgreSQL through ``executor_url`` (a
    read-only role's; QueryRoleRefused for one that can write)."""
    match url:
        case SqliteUrl(path):
            from blockx_chain.store.query_sqlite import SqliteQueries

            return SqliteQueries(path, limits)
        case PostgresUrl():
            from blockx_chain.store.query_postgres import PostgresQueries

            if executor_url is None:
                raise ValueError("a PostgreSQL block database needs the executor role's URL")
            return await PostgresQueries.open(executor_url, limits)
