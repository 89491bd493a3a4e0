"""What every sink store does, whatever its engine.

Each write is one database transaction: it locks what it writes, creates or widens
the table as the rows need, writes, and commits; any failure rolls all of it back.
Engines supply the transaction (``SinkTx``): SQLite serializes writers with
``BEGIN IMMEDIATE``; PostgreSQL takes a transaction-level advisory lock per
(table, block), so writers of different blocks of one table run side by side and
two writers of one block take turns.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from blockx_chain.sink.encode import encode_rows
from blockx_chain.sink.errors import SinkRejected
from blockx_chain.sink.schema import (
    BLOCK_HASH,
    BLOCK_NUMBER,
    CODE_EPOCH,
    COLUMNS_TABLE,
    LEDGER,
    ROW_INDEX,
    STAMP_TYPES,
    Plan,
    SinkType,
    identifier,
    parse_types,
    plan,
    sql_type,
    writable_table,
)

DEFAULT_BLOCK_KEY: Final = (BLOCK_NUMBER, ROW_INDEX)


def _meta_statements(postgres: bool) -> list[str]:
    big = "BIGINT" if postgres else "INTEGER"
    return [
        f"CREATE TABLE IF NOT EXISTS {COLUMNS_TABLE} (table_name TEXT NOT NULL, "
        "column_name TEXT NOT NULL, column_type TEXT NOT NULL, "
        "PRIMARY KEY (table_name, column_name))",
        f"CREATE TABLE IF NOT EXISTS {LEDGER} (table_name TEXT NOT NULL, "
        f"block_number {big} NOT NULL, block_hash TEXT NOT NULL, code_epoch {big} NOT NULL, "
        f"task_id TEXT NOT NULL, written_at_ms {big} NOT NULL, "
        "PRIMARY KEY (table_name, block_number))",
    ]


class SinkTx(abc.ABC):
    """One open transaction; statements use ``?`` placeholders."""

    postgres: bool

    @abc.abstractmethod
    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    async def execute(self, sql: str, params: tuple[Any, ...] = ()) -> None: ...

    @abc.abstractmethod
    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None: ...

    @abc.abstractmethod
    async def lock(self, keys: Sequence[str]) -> None:
        """Hold these named locks until the transaction ends (in the order given)."""


def _index_name(prefix: str, table: str, columns: Sequence[str]) -> str:
    digest = hashlib.sha1("\0".join([table, *columns]).encode()).hexdigest()[:16]
    return f'"{prefix}_{digest}"'


class SinkStore(abc.ABC):
    def __init__(self, description: str) -> None:
        self.description = description
        self._meta_ready = False

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[SinkTx]:
        """One transaction: commits on leaving, rolls back on an exception."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def replace_blocks(
        self,
        table: str,
        blocks: Sequence[tuple[int, str, Sequence[Mapping[str, Any]]]],
        key: Sequence[str] | None = None,
        columns: Mapping[str, Any] | None = None,
        *,
        code_epoch: int = 0,
        task_id: str = "",
        now_ms: int = 0,
    ) -> dict[str, int]:
        """In one transaction, for each ``(block_number, block_hash, rows)``: delete
        the table's rows of that block, insert ``rows`` stamped with block_number,
        block_hash, code_epoch (and row_index, the row's position, without ``key``),
        and record the block in ``_blockx_written``. A block with no rows is
        recorded too. Returns the blocks and rows written."""
        writable_table(table)
        key_columns = list(key) if key else list(DEFAULT_BLOCK_KEY)
        declared = _stamped_types(parse_types(columns), with_row_index=not key)
        numbers: list[int] = []
        ledger: list[tuple[Any, ...]] = []
        # The rows as given, and the columns the writer stamps on them.
        given: list[Mapping[str, Any]] = []
        stamps: dict[str, list[Any]] = {BLOCK_NUMBER: [], BLOCK_HASH: [], CODE_EPOCH: []}
        if not key:
            stamps[ROW_INDEX] = []
        for number, block_hash, rows in blocks:
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise SinkRejected(f"block number {number!r} is no block number")
            if not isinstance(block_hash, str):
                raise SinkRejected(f"block {number}: hash {block_hash!r} is no text")
            numbers.append(number)
            count = len(rows)
            given.extend(rows)
            stamps[BLOCK_NUMBER].extend([number] * count)
            stamps[BLOCK_HASH].extend([block_hash] * count)
            stamps[CODE_EPOCH].extend([code_epoch] * count)
            if not key:
                stamps[ROW_INDEX].extend(range(count))
            ledger.append((table, number, block_hash, code_epoch, task_id, now_ms))
        brought = _stampable(table, given, stamps, key)
        if brought is None:
            # Some row cannot be stamped: say which, the first in block and row order.
            for number, block_hash, rows in blocks:
                for index, row in enumerate(rows):
                    _stamp(table, row, number, block_hash, code_epoch, index, key)
            raise AssertionError("_stampable refused rows _stamp accepts")  # pragma: no cover
        if len(set(numbers)) != len(numbers):
            raise SinkRejected("replace_blocks was given the same block twice")
        if not numbers:
            return {"blocks": 0, "rows": 0}
        async with self.transaction() as tx:
            await tx.lock([f"{table}:{n}" for n in sorted(numbers)])
            types = await self._widened(tx, table, declared, given, key_columns)
            quoted = identifier(table, "table")
            # One statement per run of consecutive blocks, not one per block.
            runs = _runs(numbers)
            await tx.executemany(f"DELETE FROM {quoted} WHERE block_number BETWEEN ? AND ?", runs)
            await self._insert(
                tx, table, types, given, key_columns, conflict=None, stamps=stamps, brought=brought
            )
            await tx.executemany(
                f"DELETE FROM {LEDGER} WHERE table_name = ? AND block_number BETWEEN ? AND ?",
                [(table, low, high) for low, high in runs],
            )
            await tx.executemany(
                f"INSERT INTO {LEDGER} (table_name, block_number, block_hash, code_epoch, "
                "task_id, written_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
                ledger,
            )
        return {"blocks": len(numbers), "rows": len(given)}

    async def upsert(
        self,
        table: str,
        rows: Sequence[Mapping[str, Any]],
        key: Sequence[str],
        columns: Mapping[str, Any] | None = None,
    ) -> dict[str, int]:
        """Insert ``rows``, replacing the columns of a row whose ``key`` is already
        there. Returns the rows written."""
        writable_table(table)
        if not key:
            raise SinkRejected("upsert needs a key: the columns that identify a row")
        declared = parse_types(columns)
        checked = [_mapping(table, row) for row in rows]
        if not checked:
            return {"rows": 0}
        async with self.transaction() as tx:
            types = await self._widened(tx, table, declared, checked, list(key))
            await self._insert(tx, table, types, checked, list(key), conflict=list(key))
        return {"rows": len(checked)}

    async def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` (NUMERIC as decimal text), in insertion order for
        SQLite and by block then row for stamped tables."""
        quoted = identifier(table, "table")
        async with self.transaction() as tx:
            types = await self._known(tx, table)
            if not types:
                return []
            order = " ORDER BY block_number" if BLOCK_NUMBER in types else ""
            if ROW_INDEX in types:
                order += ", row_index"
            names = ", ".join(identifier(n, "column") for n in types)
            return await tx.fetch(f"SELECT {names} FROM {quoted}{order}", ())

    async def written(
        self, table: str, from_block: int | None = None, to_block: int | None = None
    ) -> list[dict[str, Any]]:
        """The ledger rows of ``table`` (within ``[from_block, to_block]`` when given),
        by block number."""
        where = "table_name = ?"
        params: list[Any] = [table]
        if from_block is not None:
            where += " AND block_number >= ?"
            params.append(from_block)
        if to_block is not None:
            where += " AND block_number <= ?"
            params.append(to_block)
        async with self.transaction() as tx:
            await self._known(tx, table)  # makes the ledger on a sink never written
            return await tx.fetch(
                f"SELECT * FROM {LEDGER} WHERE {where} ORDER BY block_number", tuple(params)
            )

    async def written_span(self, table: str) -> tuple[int, int] | None:
        """The lowest and highest block numbers in the ledger of ``table``."""
        async with self.transaction() as tx:
            await self._known(tx, table)
            rows = await tx.fetch(
                f"SELECT MIN(block_number) AS low, MAX(block_number) AS high FROM {LEDGER} "
                "WHERE table_name = ?",
                (table,),
            )
        if not rows or rows[0]["high"] is None:
            return None
        return int(rows[0]["low"]), int(rows[0]["high"])

    async def delete_blocks(self, table: str, numbers: Sequence[int]) -> int:
        """In one transaction, remove ``table``'s rows of these blocks and their
        ledger entries (blocks that left the canonical chain). Returns the ledger
        entries removed."""
        writable_table(table)
        wanted = sorted(set(numbers))
        if not wanted:
            return 0
        async with self.transaction() as tx:
            await tx.lock([f"{table}:{n}" for n in wanted])
            if await self._known(tx, table):
                await tx.executemany(
                    f"DELETE FROM {identifier(table, 'table')} WHERE block_number = ?",
                    [(n,) for n in wanted],
                )
            marks = ", ".join("?" for _ in wanted)
            present = await tx.fetch(
                f"SELECT block_number FROM {LEDGER} WHERE table_name = ? "
                f"AND block_number IN ({marks})",
                (table, *wanted),
            )
            await tx.executemany(
                f"DELETE FROM {LEDGER} WHERE table_name = ? AND block_number = ?",
                [(table, n) for n in wanted],
            )
        return len(present)

    async def _known(self, tx: SinkTx, table: str) -> dict[str, SinkType]:
        if not self._meta_ready:
            await tx.lock(["_blockx_meta"])
            for statement in _meta_statements(tx.postgres):
                await tx.execute(statement)
            self._meta_ready = True
        rows = await tx.fetch(
            f"SELECT column_name, column_type FROM {COLUMNS_TABLE} WHERE table_name = ?",
            (table,),
        )
        return {r["column_name"]: SinkType(r["column_type"]) for r in rows}

    async def _widened(
        self,
        tx: SinkTx,
        table: str,
        declared: Mapping[str, SinkType],
        rows: Sequence[Mapping[str, Any]],
        key: Sequence[str],
    ) -> dict[str, SinkType]:
        """The table's column types once it holds every column ``rows`` bring."""
        known = await self._known(tx, table)
        needed = plan(table, known, declared, rows)
        if needed.added:
            # Another writer may be widening the same table: take turns, then look again.
            await tx.lock([f"{table}:schema"])
            known = await self._known(tx, table)
            needed = plan(table, known, declared, rows)
            await self._apply(tx, table, bool(known), needed, key)
        for name in key:
            identifier(name, "key column")
            if name not in needed.types:
                raise SinkRejected(f"key column {name!r} of table {table!r} is in no row")
        return needed.types

    async def _apply(
        self, tx: SinkTx, table: str, exists: bool, needed: Plan, key: Sequence[str]
    ) -> None:
        quoted = identifier(table, "table")
        pg = tx.postgres
        if not needed.added:
            return
        if not exists:
            for name in key:
                if name not in needed.types:
                    raise SinkRejected(f"key column {name!r} of table {table!r} is in no row")
            body = ", ".join(
                f"{identifier(name, 'column')} {sql_type(kind, pg)}" for name, kind in needed.added
            )
            await tx.execute(f"CREATE TABLE {quoted} ({body})")
            key_list = ", ".join(identifier(name, "key column") for name in key)
            await tx.execute(
                f"CREATE UNIQUE INDEX {_index_name('ux', table, key)} ON {quoted} ({key_list})"
            )
            if BLOCK_NUMBER in needed.types and key[0] != BLOCK_NUMBER:
                await tx.execute(
                    f"CREATE INDEX {_index_name('ix', table, [BLOCK_NUMBER])} "
                    f"ON {quoted} (block_number)"
                )
        else:
            for name, kind in needed.added:
                await tx.execute(
                    f"ALTER TABLE {quoted} ADD COLUMN {identifier(name, 'column')} "
                    f"{sql_type(kind, pg)}"
                )
        await tx.executemany(
            f"INSERT INTO {COLUMNS_TABLE} (table_name, column_name, column_type) VALUES (?, ?, ?)",
            [(table, name, kind.value) for name, kind in needed.added],
        )

    async def _insert(
        self,
        tx: SinkTx,
        table: str,
        types: Mapping[str, SinkType],
        rows: Sequence[Mapping[str, Any]],
        key: Sequence[str],
        *,
        conflict: list[str] | None,
        stamps: dict[str, list[Any]] | None = None,
        brought: set[str] | None = None,
    ) -> None:
        """Insert ``rows`` (with the ``stamps`` columns, which win over a row's own
        value; ``brought``: the column names the rows have, when known)."""
        if not rows:
            return
        stamps = stamps or {}
        present = set(stamps).union(*rows) if brought is None else {*stamps, *brought}
        names = [name for name in types if name in present]
        columns = [stamps[n] if n in stamps else [row.get(n) for row in rows] for n in names]
        values = encode_rows(table, [types[n] for n in names], names, columns, key, tx.postgres)
        quoted = identifier(table, "table")
        column_list = ", ".join(identifier(n, "column") for n in names)
        marks = ", ".join("?" for _ in names)
        sql = f"INSERT INTO {quoted} ({column_list}) VALUES ({marks})"
        if conflict is not None:
            targets = ", ".join(identifier(n, "key column") for n in conflict)
            others = [n for n in names if n not in conflict]
            if others:
                updates = ", ".join(
                    f"{identifier(n, 'column')} = excluded.{identifier(n, 'column')}"
                    for n in others
                )
                sql += f" ON CONFLICT ({targets}) DO UPDATE SET {updates}"
            else:
                sql += f" ON CONFLICT ({targets}) DO NOTHING"
        await tx.executemany(sql, values)


def _runs(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """``numbers`` (distinct) as runs of consecutive numbers: ``(first, last)``."""
    runs: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def _stamped_types(declared: dict[str, SinkType], *, with_row_index: bool) -> dict[str, SinkType]:
    stamps = {n: t for n, t in STAMP_TYPES.items() if n != ROW_INDEX or with_row_index}
    for name, kind in stamps.items():
        if name in declared and declared[name] is not kind:
            raise SinkRejected(f"column {name!r} is the writer's, always {kind}")
    return {**stamps, **declared}


def _stampable(
    table: str,
    rows: Sequence[Any],
    stamps: Mapping[str, list[Any]],
    key: Sequence[str] | None,
) -> set[str] | None:
    """The column names ``rows`` bring, or None when some row cannot be stamped
    (``_stamp`` says why): it is no object of column names, it carries a block
    number or hash other than its call's, or a row_index without a key."""
    if not all(issubclass(kind, Mapping) for kind in set(map(type, rows))):
        return None
    brought: set[str] = set().union(*rows)
    if not all(isinstance(name, str) for name in brought):
        return None
    if not key and ROW_INDEX in brought:
        return None
    for name in (BLOCK_NUMBER, BLOCK_HASH):
        if name in brought:
            for row, expected in zip(rows, stamps[name], strict=True):
                own = row.get(name)
                if own is not None and own != expected:
                    return None
    return brought


def _mapping(table: str, row: Any) -> dict[str, Any]:
    if not isinstance(row, Mapping) or not all(isinstance(k, str) for k in row):
        raise SinkRejected(f"a row of table {table!r} is no object of column names: {row!r:.80}")
    return dict(row)


def _stamp(
    table: str,
    row: Any,
    number: int,
    block_hash: str,
    code_epoch: int,
    index: int,
    key: Sequence[str] | None,
) -> dict[str, Any]:
    stamped = _mapping(table, row)
    for name, expected in ((BLOCK_NUMBER, number), (BLOCK_HASH, block_hash)):
        own = stamped.get(name)
        if own is not None and own != expected:
            raise SinkRejected(
                f"a row of block {number} carries {name} {own!r}, not its call's {expected!r}"
            )
    if not key and ROW_INDEX in stamped:
        raise SinkRejected(
            f"a row of table {table!r} carries {ROW_INDEX!r}, which the writer sets when no "
            "key is given (give a key, or rename the column)"
        )
    stamped[BLOCK_NUMBER] = number
    stamped[BLOCK_HASH] = block_hash
    stamped[CODE_EPOCH] = code_epoch
    if not key:
        stamped[ROW_INDEX] = index
    return stamped
