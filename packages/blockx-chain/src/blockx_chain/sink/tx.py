"""One open transaction of a sink store, the part each engine supplies."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from blockx_chain.sink.schema import SinkType


class IndexInfo(NamedTuple):
    name: str
    table: str
    columns: list[str]


class SinkTx(abc.ABC):
    """One open transaction; statements use ``?`` placeholders."""

    postgres: bool
    # The most columns a table of this engine may have.
    max_columns: int

    @abc.abstractmethod
    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    async def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None: ...

    @abc.abstractmethod
    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None: ...

    @abc.abstractmethod
    async def insert(
        self, sql: str, encode: Callable[[], list[tuple[Any, ...]]], count: int
    ) -> None:
        """Run ``sql`` for each of the ``count`` rows ``encode()`` gives: a chunk of
        a write's rows, which may hold the event loop while it is converted and
        inserted."""

    @abc.abstractmethod
    async def lock(self, keys: Sequence[str]) -> None:
        """Hold these named locks until the transaction ends (in the order given)."""

    @abc.abstractmethod
    async def taken(self, name: str) -> str | None:
        """What already bears the name ``name`` in the database (``table``,
        ``index``, ...), None when nothing does."""

    @abc.abstractmethod
    async def widen(self, table: str, columns: Mapping[str, SinkType]) -> None:
        """Give these columns of ``table`` these (wider) types, converting what they hold."""

    @abc.abstractmethod
    async def legacy_indexes(self) -> list[IndexInfo]:
        """The indexes named like the writers' indexes before they moved under
        ``_blockx_`` (``ux_`` or ``ix_`` and 16 hex digits)."""

    @abc.abstractmethod
    async def rename_index(self, index: IndexInfo, new_name: str, *, unique: bool) -> None: ...

    @abc.abstractmethod
    async def column_names(self, table: str) -> list[str]:
        """The columns the database holds for ``table`` (empty: no such table)."""

    @abc.abstractmethod
    async def table_indexes(self, table: str) -> list[IndexInfo]:
        """The indexes on ``table`` named under ``_blockx_``, with their columns."""
