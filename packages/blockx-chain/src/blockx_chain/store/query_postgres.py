"""Read-only SQL on a PostgreSQL block database (``io.blockdb_executor``).

Statements run under a role of their own (its URL is BLOCKDB_EXECUTOR_URL, or a
chain's ``blockdb_executor_url``) that can only read the chain tables: the
operator creates it (docs/blockdb-executor.md gives the SQL). ``open`` checks the
role really is read-only and refuses it otherwise (QueryRoleRefused): a superuser,
a role that may INSERT, UPDATE, DELETE or TRUNCATE a table of the block database,
or CREATE in its schema.

Each statement is one ``READ ONLY`` transaction with ``SET LOCAL
statement_timeout``; its rows come through a cursor a batch at a time, so fetching
stops at the first bound passed (the whole is also bounded by the wall-time limit
on this side). asyncpg sends it through the extended protocol, which refuses a
second statement; a write is refused by the transaction and by the role, a read
of a table the role may not read by the role.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any, Final

import asyncpg

from blockx_chain.store.errors import SchemaRefused, StoreError, StoreUnavailable
from blockx_chain.store.postgres import UNREACHABLE
from blockx_chain.store.query import (
    QUERY_TABLES,
    QueryLimits,
    QueryRefused,
    RowBudget,
    Statement,
    timed_out,
)
from blockx_chain.url import PostgresUrl, describe

POOL_SIZE: Final = 4
_CONNECT_TIMEOUT_S: Final = 10.0
_FETCH: Final = 256
# The server stops a statement at its limit; this side waits a little longer
# before it gives up on the connection.
_GRACE_S: Final = 2.0
# SQLSTATE classes that say the server, not the statement, failed.
_SERVER_CLASSES: Final = ("08", "53", "57", "58", "XX")


class QueryRoleRefused(SchemaRefused):
    """The executor's role may write, or is no role of this block database."""


def _sqlstate(exc: asyncpg.PostgresError) -> str:
    return str(getattr(exc, "sqlstate", "") or "")


def _plain(value: Any) -> Any:
    # uint256 columns are NUMERIC(78,0): decimal strings, as io.blockdb answers them.
    return format(value, "f") if isinstance(value, Decimal) else value


class PostgresQueries:
    def __init__(self, pool: asyncpg.Pool[Any], schema: str, description: str, limits: QueryLimits):
        self._pool = pool
        self.schema = schema
        self.description = description
        self.limits = limits

    @classmethod
    async def open(cls, url: PostgresUrl, limits: QueryLimits) -> PostgresQueries:
        """Connect as the executor's role and check it only reads; StoreUnavailable
        when the server cannot be reached, QueryRoleRefused for a role that can write."""
        description = describe(url)
        try:
            pool = await asyncpg.create_pool(
                url.dsn, min_size=0, max_size=POOL_SIZE, timeout=_CONNECT_TIMEOUT_S
            )
        except (*UNREACHABLE, asyncpg.PostgresError) as exc:
            raise StoreUnavailable(f"{description}: {exc}") from None
        try:
            schema = await _check_role(pool, description)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, schema, description, limits)

    async def query(self, statement: Statement) -> list[dict[str, Any]]:
        """The rows of ``statement``; QueryRefused, QueryTimedOut, TooManyRows,
        QueryTooLarge, or StoreUnavailable when the server cannot be reached."""
        sql = statement.sql
        if statement.pinned is not None:
            sql = statement.pinned_sql(_quoted(self.schema))
        assert isinstance(statement.params, tuple)
        budget = RowBudget(self.limits)
        try:
            async with asyncio.timeout(self.limits.timeout_ms / 1000 + _GRACE_S):
                async with self._pool.acquire() as conn, conn.transaction(readonly=True):
                    await conn.execute(f"SET LOCAL statement_timeout = {self.limits.timeout_ms}")
                    async for record in conn.cursor(sql, *statement.params, prefetch=_FETCH):
                        budget.add({k: _plain(v) for k, v in record.items()})
        except TimeoutError:
            raise timed_out(self.limits) from None
        except asyncpg.QueryCanceledError:
            raise timed_out(self.limits) from None
        except asyncpg.DataError as exc:
            raise QueryRefused(f"the SQL failed: {exc}") from None
        except asyncpg.PostgresError as exc:
            if _sqlstate(exc).startswith(_SERVER_CLASSES):
                raise StoreUnavailable(f"{self.description}: {exc}") from None
            raise _refusal(exc) from None
        except UNREACHABLE as exc:
            raise StoreUnavailable(f"{self.description}: {exc}") from None
        return budget.rows

    async def close(self) -> None:
        await self._pool.close()


def _refusal(exc: asyncpg.PostgresError) -> StoreError:
    state = _sqlstate(exc)
    if state == "25006":  # read_only_sql_transaction
        return QueryRefused(
            f"{exc}: io.blockdb_executor only reads the chain tables (a write is refused)"
        )
    if state == "42501":  # insufficient_privilege
        return QueryRefused(
            f"{exc}: io.blockdb_executor reads only the chain tables "
            f"({', '.join(sorted(QUERY_TABLES))})"
        )
    if "multiple commands" in str(exc):
        return QueryRefused("multiple statements are refused: io.blockdb_executor runs one")
    return QueryRefused(f"the SQL failed: {exc}")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _check_role(pool: asyncpg.Pool[Any], description: str) -> str:
    """The schema the role reads the chain tables in; QueryRoleRefused for a role
    that could write."""
    try:
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT current_user AS name, rolsuper, current_schema() AS schema "
                "FROM pg_roles WHERE rolname = current_user"
            )
            assert row is not None  # current_user is a role
            user, superuser, schema = row["name"], row["rolsuper"], row["schema"]
            if superuser:
                raise QueryRoleRefused(
                    f"{description}: the role {user} is a superuser; io.blockdb_executor needs "
                    "a role that can only read the chain tables (docs/blockdb-executor.md)"
                )
            if schema is None:
                raise QueryRoleRefused(
                    f"{description}: the role {user} has no schema on its search_path"
                )
            writable = await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm') AND "
                "has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE') "
                "ORDER BY c.relname",
                schema,
            )
            if writable:
                names = ", ".join(r["relname"] for r in writable[:8])
                raise QueryRoleRefused(
                    f"{description}: the role {user} can write {names}; io.blockdb_executor "
                    "needs a role that can only read the chain tables (docs/blockdb-executor.md)"
                )
            if await conn.fetchval("SELECT has_schema_privilege($1, 'CREATE')", schema):
                raise QueryRoleRefused(
                    f"{description}: the role {user} may CREATE in schema {schema}; "
                    "io.blockdb_executor needs a role that can only read the chain tables"
                )
    except UNREACHABLE as exc:
        raise StoreUnavailable(f"{description}: {exc}") from None
    except asyncpg.PostgresError as exc:
        raise StoreUnavailable(f"{description}: {exc}") from None
    return str(schema)
