"""``io.blockdb_executor``: read-only SQL over the task's chain's block database.

``query(sql, params=None, through_block=None)`` -> the statement's rows, dicts
keyed by column name, in the order the statement gives. ``sql`` is one SELECT
(or WITH ... SELECT, VALUES) over the chain tables: the block tables
(``blockx_chain.schema.BLOCK_TABLES``) and ``chain``; ``params`` its bound values,
a list for ``?`` marks or a dict for ``:name`` marks, never text pasted in.
Anything else (a write, ATTACH, a PRAGMA, another table, a sink sharing the
database, a second statement) is BAD_REQUEST naming what was refused; see
``blockx_chain.store.query`` and the engines' modules for how each is refused.

Bounded: BLOCKDB_MAX_ROWS rows, BLOCKDB_QUERY_MAX_BYTES bytes of answer, and
BLOCKDB_QUERY_TIMEOUT_MS of wall time (CALL_DEADLINE_MS when unset); a bound
passed is BAD_REQUEST naming it (a statement stopped at its time limit too: the
same statement would be stopped again). The router times the backend, so the
query's time is charged to the call's budget as backend time.

``through_block=N`` reads the block tables only at block numbers <= N: such an
answer never changes once N is final, so it is cached (``immutable``) when N is
at or below the chain's finalized height; an unpinned query never is.

On PostgreSQL the statements run as a read-only role (BLOCKDB_EXECUTOR_URL, or a
chain's ``blockdb_executor_url``) checked at start-up; without it the chain has no
io.blockdb_executor (see ``blockx_server.io.chain_config``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Final

from blockx_chain.schema import Engine
from blockx_chain.store import StoreError, StoreUnavailable, TooManyRows
from blockx_chain.store.query import (
    QueryLimits,
    QueryRefused,
    QueryTimedOut,
    QueryTooLarge,
    prepare,
)
from blockx_chain.store.query_engine import QueryEngine, open_queries
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl, describe
from blockx_core.failures import IoErrorKind
from blockx_server.io.errors import BackendError, IoReason

log = logging.getLogger(__name__)

NAME: Final = "blockdb_executor"


def query(sql: str, params: Any = None, through_block: int | None = None) -> None:
    """The signature of ``io.blockdb_executor.query``."""


_SIGNATURE: Final = inspect.signature(query)


class BlockDbExecutorBackend:
    name = NAME
    read_ops = frozenset({"query"})
    write_ops: frozenset[str] = frozenset()

    def __init__(
        self, url: BlockDbUrl, limits: QueryLimits, executor_url: PostgresUrl | None = None
    ) -> None:
        self.url = url
        self.limits = limits
        self.executor_url = executor_url
        self._engine: QueryEngine | None = None
        self._opening = asyncio.Lock()

    @property
    def engine_kind(self) -> Engine:
        return Engine.SQLITE if isinstance(self.url, SqliteUrl) else Engine.POSTGRES

    async def start(self) -> None:
        """Connect now; QueryRoleRefused (a role that can write) goes to the caller.
        A database that does not answer yet is logged and tried again on first use."""
        try:
            await self._opened()
        except StoreUnavailable as exc:
            log.warning("io.%s: %s; queries answer UNAVAILABLE until it answers", NAME, exc)

    async def _opened(self) -> QueryEngine:
        async with self._opening:
            if self._engine is None:
                self._engine = await open_queries(self.url, self.executor_url, self.limits)
                where = describe(self.executor_url or self.url)
                log.info("io.%s queries %s read-only", NAME, where)
            return self._engine

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if op != "query":
            raise BackendError(IoErrorKind.UNKNOWN_OP, op)
        bound = _SIGNATURE.bind(*args, **kwargs).arguments  # TypeError: BAD_REQUEST
        try:
            statement = prepare(
                bound["sql"], bound.get("params"), bound.get("through_block"), self.engine_kind
            )
            engine = await self._opened()
            return await engine.query(statement)
        except (QueryRefused, QueryTimedOut, QueryTooLarge) as exc:
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.{NAME}.query: {exc}") from None
        except TooManyRows as exc:
            raise BackendError(
                IoErrorKind.BAD_REQUEST, f"io.{NAME}.{exc}", reason=IoReason.TOO_MANY_ROWS
            ) from None
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.{NAME}: {exc}") from None

    async def chain_id(self) -> int | None:
        """The chain id of the database the statements read (its ``chain`` row), or
        None while it cannot be read: start-up checks it is the block database's."""
        try:
            engine = await self._opened()
            rows = await engine.query(
                prepare("SELECT chain_id FROM chain", None, None, self.engine_kind)
            )
        except StoreError:
            return None
        return int(rows[0]["chain_id"]) if rows else None

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """A query pinned (``through_block``) at or below the finalized height, and
        one the backend accepts; never an unpinned one."""
        if op != "query" or finalized is None:
            return False
        try:
            bound = _SIGNATURE.bind(*args, **kwargs).arguments
            statement = prepare(
                bound["sql"], bound.get("params"), bound.get("through_block"), self.engine_kind
            )
        except (TypeError, QueryRefused):
            return False
        return statement.pinned is not None and statement.pinned <= finalized
