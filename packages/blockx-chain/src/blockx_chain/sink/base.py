"""What every sink store does, whatever its engine.

Each write is one database transaction: it checks that the sink is the one the
writer was told to write (when told), locks what it writes, creates, extends or
widens the table as the rows need, writes, and commits; any failure rolls all of
it back. Engines supply the transaction (``SinkTx``): SQLite serializes writers
with ``BEGIN IMMEDIATE``; PostgreSQL takes a transaction-level advisory lock per
(table, chain, block), so writers of different blocks of one table run side by
side and two writers of one block take turns.

A block write stamps each row with its chain's id (``chain_id``) beside its block,
and the ledger (``_blockx_written``) is keyed by (table, chain id, block): a write
replaces, and a delete removes, the rows of its chain's blocks only, so several
chains share a table without touching each other's rows.

A large write holds the event loop for at most one chunk at a time: its rows are
checked on a thread of the store's own, and inserted in chunks of ``chunk_rows``
rows within the one transaction (SQLite: each chunk converted and inserted on the
loop's thread, the loop's other work run between two chunks; PostgreSQL: each
chunk converted on the store's thread, before asyncpg sends it).

The writers' own tables (``_blockx_columns``, ``_blockx_written``,
``_blockx_sink``, and ``_blockx_jobs``, the drivers' job records:
``blockx_chain.sink.jobs``) are made, and older layouts brought up to date, once
per store before its first transaction. A store opened ``read_only`` makes
nothing: it only reads the job records, finding none where the table is missing.
``_blockx_sink`` holds the sink's identity, a random id made with it: a driver
reads it from the sink it was given and puts it into the writer's config, and a
Worker whose sink has another identity refuses the write (``SinkMismatch``)
before writing anything.

A sink written before rows carried their chain (layout version 1: a ledger
without ``chain_id``, stamped tables without it) is marked once, in one
transaction: the ledger rebuilt with the chain id, each stamped table given the
column (filled with it) and its writers' indexes led by it. Its rows belong to
the one chain its cluster served then, which the store cannot tell by itself:
until a caller names that chain (``mark_chain``, or a write with
``claim_unmarked``), the ledger's reads and the block writes refuse the sink
(SinkRejected, nothing written). A sink holding no rows is marked at once.
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import contextlib
import functools
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, NamedTuple, TypeVar

from blockx_chain.sink import code as sink_code
from blockx_chain.sink.code import BlockCode, WrittenCode
from blockx_chain.sink.encode import encode_rows
from blockx_chain.sink.errors import SinkMismatch, SinkRejected
from blockx_chain.sink.jobs import (
    JOBS_KEPT,
    NEWEST_SQL,
    ONE_SQL,
    PRUNE_SQL,
    PUT_SQL,
    JobEntry,
    job_statements,
    put_params,
)
from blockx_chain.sink.schema import (
    BLOCK_HASH,
    BLOCK_NUMBER,
    CHAIN_ID,
    CODE_EPOCH,
    COLUMNS_TABLE,
    INT64,
    JOBS_TABLE,
    LEDGER,
    ROW_INDEX,
    SINK_TABLE,
    STAMP_TYPES,
    Plan,
    SinkType,
    Values,
    identifier,
    index_name,
    parse_types,
    plan,
    sql_type,
    writable_table,
)
from blockx_chain.sink.tx import SinkTx

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BLOCK_KEY: Final = (BLOCK_NUMBER, ROW_INDEX)
# Rows inserted per statement batch of a write (SINK_WRITE_CHUNK_ROWS on the Worker).
DEFAULT_CHUNK_ROWS: Final = 10_000
# Checking fewer rows than this costs less than a thread hop: done on the caller's thread.
OFFLOAD_FROM_ROWS: Final = 1_000
# Version 1: the writers' index names moved under ``_blockx_``. Version 2: the
# ledger and the stamped tables carry each row's chain id.
INDEXES_VERSION: Final = 1
LAYOUT_VERSION: Final = 2
_META_LOCK: Final = "_blockx_meta"
# The ledger being rebuilt with chain ids (a writer-side name: no sink table takes it).
_LEDGER_REBUILT: Final = "_blockx_written_chained"
_LEDGER_COLUMNS: Final = (
    "table_name, chain_id, block_number, block_hash, code_epoch, task_id, written_at_ms"
)


def _ledger_statement(postgres: bool, name: str) -> str:
    big = "BIGINT" if postgres else "INTEGER"
    return (
        f"CREATE TABLE IF NOT EXISTS {name} (table_name TEXT NOT NULL, "
        f"chain_id {big} NOT NULL, block_number {big} NOT NULL, block_hash TEXT NOT NULL, "
        f"code_epoch {big} NOT NULL, task_id TEXT NOT NULL, written_at_ms {big} NOT NULL, "
        "PRIMARY KEY (table_name, chain_id, block_number))"
    )


def _meta_statements(postgres: bool) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {COLUMNS_TABLE} (table_name TEXT NOT NULL, "
        "column_name TEXT NOT NULL, column_type TEXT NOT NULL, "
        "PRIMARY KEY (table_name, column_name))",
        _ledger_statement(postgres, LEDGER),
        f"CREATE TABLE IF NOT EXISTS {SINK_TABLE} (identity TEXT NOT NULL, "
        "version INTEGER NOT NULL)",
        *job_statements(postgres),
    ]


class SinkStore(abc.ABC):
    def __init__(
        self,
        description: str,
        *,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        read_only: bool = False,
    ) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.description = description
        self.chunk_rows = chunk_rows
        self.read_only = read_only
        self._meta_ready = False
        self._meta_turn = asyncio.Lock()
        # The sink holds rows written before rows carried their chain (see the module).
        self._unmarked = False
        # The code digests this store has stored (``blockx_chain.sink.code``).
        self._code_known: set[str] = set()
        # Checking and converting rows holds the interpreter: two threads keep a small
        # write from waiting behind a large one's checks.
        self._cpu = ThreadPoolExecutor(2, thread_name_prefix="sink-encode")

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[SinkTx]:
        """One transaction: commits on leaving, rolls back on an exception."""

    @abc.abstractmethod
    async def _close(self) -> None: ...

    async def close(self) -> None:
        await self._close()
        self._cpu.shutdown(wait=False, cancel_futures=True)

    async def offload(self, work: Callable[[], T], rows: int) -> T:
        """``work()`` on the store's own thread when it concerns ``rows`` rows or
        more, else at once on the caller's."""
        if rows < OFFLOAD_FROM_ROWS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._cpu, work)

    async def identity(self) -> str:
        """The sink's identity: made with its writers' tables, the same for every
        store opened on this database."""
        await self._ready()
        async with self.transaction() as tx:
            return await _identity(tx)

    async def replace_blocks(
        self,
        table: str,
        chain_id: int,
        blocks: Sequence[tuple[int, str, Sequence[Mapping[str, Any]]]],
        key: Sequence[str] | None = None,
        columns: Mapping[str, Any] | None = None,
        *,
        code_epoch: int = 0,
        task_id: str = "",
        now_ms: int = 0,
        sink_identity: str | None = None,
        claim_unmarked: bool = False,
        code_digest: str | None = None,
        code_sources: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """In one transaction, for each ``(block_number, block_hash, rows)`` of the
        chain ``chain_id``: delete the table's rows of that chain's block, insert
        ``rows`` stamped with chain_id, block_number, block_hash, code_epoch (and
        row_index, the row's position, without ``key``), and record the block in
        ``_blockx_written``. A block with no rows is recorded too. A table's rows are
        unique by chain_id and ``key`` (by default block_number, row_index). With
        ``sink_identity``, SinkMismatch (nothing written) when the sink has another
        identity. ``claim_unmarked``: rows written before rows carried their chain
        are this chain's (the writer serves this chain alone); without it such a
        sink is refused. ``code_digest`` and ``code_sources``: the digest and the
        sources of the task's module set, kept with the task
        (``blockx_chain.sink.code``). Returns the blocks and rows written."""
        writable_table(table)
        chain_id = _chain_id(chain_id)
        code = sink_code.checked_code(code_digest, code_sources, code_epoch, task_id)
        key_columns = [CHAIN_ID, *(k for k in key or DEFAULT_BLOCK_KEY if k != CHAIN_ID)]
        declared = stamped_types(parse_types(columns), with_row_index=not key)
        batch = await self.offload(
            functools.partial(block_batch, table, chain_id, blocks, key), _count(blocks)
        )
        numbers = [number for number, _, _ in batch.spans]
        if not numbers and sink_identity is None:
            return {"blocks": 0, "rows": 0}
        await self._ready()
        async with self.transaction() as tx:
            await _same_sink(tx, self.description, sink_identity)
            if not numbers:
                return {"blocks": 0, "rows": 0}
            await self._marked(tx, chain_id if claim_unmarked else None)
            await tx.lock([f"{table}:{chain_id}:{n}" for n in sorted(numbers)])
            needed = await self._columns(tx, table, declared, batch.brought, key_columns)
            quoted = identifier(table, "table")
            # One statement per run of consecutive blocks, not one per block.
            runs = [(chain_id, low, high) for low, high in block_runs(numbers)]
            await tx.executemany(
                f"DELETE FROM {quoted} WHERE chain_id = ? AND block_number BETWEEN ? AND ?", runs
            )
            stamps = Stamps(batch.spans, chain_id, code_epoch, with_row_index=not key)
            await self._insert(tx, table, needed.types, batch, key_columns, stamps=stamps)
            replaced = await sink_code.unrecord_runs(tx, table, runs)
            entries = [
                (table, chain_id, n, h, code_epoch, task_id, now_ms) for n, h, _ in batch.spans
            ]
            await tx.insert(
                f"INSERT INTO {LEDGER} ({_LEDGER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                lambda: entries,
                len(entries),
            )
            await sink_code.blocks_written(tx, code, table, now_ms, self._code_known, replaced)
        self._widened(table, needed)
        return {"blocks": len(numbers), "rows": len(batch.rows)}

    async def upsert(
        self,
        table: str,
        rows: Sequence[Mapping[str, Any]],
        key: Sequence[str],
        columns: Mapping[str, Any] | None = None,
        *,
        sink_identity: str | None = None,
        code_digest: str | None = None,
        code_sources: Mapping[str, str] | None = None,
        code_epoch: int = 0,
        task_id: str = "",
        now_ms: int = 0,
    ) -> dict[str, int]:
        """Insert ``rows``, replacing the columns of a row whose ``key`` is already
        there. With ``sink_identity``, SinkMismatch (nothing written) when the sink
        has another identity. ``code_digest`` and ``code_sources`` (with
        ``code_epoch``, ``task_id`` and ``now_ms``): the task's module set, kept
        with the task as for ``replace_blocks``. Returns the rows written."""
        writable_table(table)
        code = sink_code.checked_code(code_digest, code_sources, code_epoch, task_id)
        if not key:
            raise SinkRejected("upsert needs a key: the columns that identify a row")
        declared = parse_types(columns)
        batch = await self.offload(functools.partial(_upsert_batch, table, rows), len(rows))
        if not batch.rows and sink_identity is None:
            return {"rows": 0}
        await self._ready()
        async with self.transaction() as tx:
            await _same_sink(tx, self.description, sink_identity)
            if not batch.rows:
                return {"rows": 0}
            needed = await self._columns(tx, table, declared, batch.brought, list(key))
            await self._insert(tx, table, needed.types, batch, list(key), conflict=list(key))
            await sink_code.upserted(tx, code, table, now_ms, self._code_known)
        self._widened(table, needed)
        return {"rows": len(batch.rows)}

    async def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` (NUMERIC as decimal text), in insertion order for
        SQLite and by block then row for stamped tables."""
        quoted = identifier(table, "table")
        await self._ready()
        async with self.transaction() as tx:
            types = await self._known(tx, table)
            if not types:
                return []
            order = " ORDER BY block_number" if BLOCK_NUMBER in types else ""
            if CHAIN_ID in types and order:
                order = " ORDER BY chain_id, block_number"
            if ROW_INDEX in types:
                order += ", row_index"
            names = ", ".join(identifier(n, "column") for n in types)
            return await tx.fetch(f"SELECT {names} FROM {quoted}{order}", ())

    async def column_types(self, table: str) -> dict[str, SinkType]:
        """The recorded type of each column of ``table`` (empty: no such sink table)."""
        identifier(table, "table")
        await self._ready()
        async with self.transaction() as tx:
            return await self._known(tx, table)

    async def written(
        self,
        table: str,
        chain_id: int,
        from_block: int | None = None,
        to_block: int | None = None,
    ) -> list[dict[str, Any]]:
        """The ledger rows of ``table`` for the chain ``chain_id`` (within
        ``[from_block, to_block]`` when given), by block number."""
        where = "table_name = ? AND chain_id = ?"
        params: list[Any] = [table, _chain_id(chain_id)]
        if from_block is not None:
            where += " AND block_number >= ?"
            params.append(from_block)
        if to_block is not None:
            where += " AND block_number <= ?"
            params.append(to_block)
        await self._ready()
        async with self.transaction() as tx:
            await self._marked(tx, None)
            return await tx.fetch(
                f"SELECT {_LEDGER_COLUMNS} FROM {LEDGER} WHERE {where} ORDER BY block_number",
                tuple(params),
            )

    async def written_span(self, table: str, chain_id: int) -> tuple[int, int] | None:
        """The lowest and highest block numbers in the ledger of ``table`` for the
        chain ``chain_id``."""
        chain_id = _chain_id(chain_id)
        await self._ready()
        async with self.transaction() as tx:
            await self._marked(tx, None)
            rows = await tx.fetch(
                f"SELECT MIN(block_number) AS low, MAX(block_number) AS high FROM {LEDGER} "
                "WHERE table_name = ? AND chain_id = ?",
                (table, chain_id),
            )
        if not rows or rows[0]["high"] is None:
            return None
        return int(rows[0]["low"]), int(rows[0]["high"])

    async def delete_blocks(self, table: str, chain_id: int, numbers: Sequence[int]) -> int:
        """In one transaction, remove ``table``'s rows of these blocks of the chain
        ``chain_id`` and their ledger entries (blocks that left the canonical chain);
        other chains' rows stay. Returns the ledger entries removed."""
        writable_table(table)
        chain_id = _chain_id(chain_id)
        wanted = sorted(set(numbers))
        if not wanted:
            return 0
        await self._ready()
        async with self.transaction() as tx:
            await self._marked(tx, None)
            await tx.lock([f"{table}:{chain_id}:{n}" for n in wanted])
            if await self._known(tx, table):
                await tx.executemany(
                    f"DELETE FROM {identifier(table, 'table')} "
                    "WHERE chain_id = ? AND block_number = ?",
                    [(chain_id, n) for n in wanted],
                )
            marks = ", ".join("?" for _ in wanted)
            present = await tx.fetch(
                f"SELECT block_number, task_id FROM {LEDGER} WHERE table_name = ? "
                f"AND chain_id = ? AND block_number IN ({marks})",
                (table, chain_id, *wanted),
            )
            await tx.executemany(
                f"DELETE FROM {LEDGER} WHERE table_name = ? AND chain_id = ? AND block_number = ?",
                [(table, chain_id, n) for n in wanted],
            )
            replaced = {str(row["task_id"]) for row in present}
            await sink_code.blocks_deleted(tx, replaced, self._code_known)
        return len(present)

    async def unmarked(self) -> bool:
        """Whether the sink holds rows written before rows carried their chain."""
        await self._ready()
        if self._unmarked:
            async with self.transaction() as tx:
                self._unmarked = await _version(tx) < LAYOUT_VERSION
        return self._unmarked

    async def unmarked_blocks(self, limit: int) -> list[dict[str, Any]]:
        """Of a sink not marked yet, the ledger entries of the ``limit`` lowest and
        the ``limit`` highest block numbers (``table_name``, ``block_number``,
        ``block_hash``), what a caller compares with a chain's hashes to learn
        whose rows they are; empty once it is marked."""
        if not await self.unmarked():
            return []
        picked = f"SELECT table_name, block_number, block_hash FROM {LEDGER} ORDER BY block_number"
        async with self.transaction() as tx:
            low = await tx.fetch(f"{picked} LIMIT ?", (limit,))
            high = await tx.fetch(f"{picked} DESC LIMIT ?", (limit,))
        return list({(r["table_name"], r["block_number"]): r for r in low + high}.values())

    async def mark_chain(self, chain_id: int) -> bool:
        """Mark the rows written before rows carried their chain as the chain
        ``chain_id``'s (see the module). Returns whether this call marked them
        (False: the sink was marked already)."""
        chain_id = _chain_id(chain_id)
        if not await self.unmarked():
            return False
        async with self.transaction() as tx:
            marked = await self._marked(tx, chain_id)
        self._unmarked = False
        return marked

    async def _marked(self, tx: SinkTx, claim: int | None) -> bool:
        """Nothing when the sink is marked; else, with ``claim``, the sink marked as
        that chain's in ``tx`` (True), or SinkRejected without it."""
        if not self._unmarked:
            return False
        if claim is not None:
            await tx.lock([_META_LOCK])
        if await _version(tx) >= LAYOUT_VERSION:
            self._unmarked = False
            return False
        if claim is None:
            raise SinkRejected(
                f"{self.description} holds rows written before sink rows carried their "
                "chain, and this writer cannot tell which chain they are: run blockx "
                "backfill or follow of that chain against this sink once (it recognizes "
                "the chain by the blocks' hashes and marks them), or write it from a "
                "Worker configured with that chain alone (BLOCKDB_URL); nothing was written"
            )
        await _mark_chain(tx, claim)
        log.warning(
            "%s: rows written before rows carried their chain marked as chain %d's",
            self.description,
            claim,
        )
        return True

    async def put_job(self, entry: JobEntry, *, prune: bool = False) -> None:
        """Write ``entry`` in ``_blockx_jobs``, replacing the record of its job_id;
        with ``prune``, also remove the ended records beyond the newest JOBS_KEPT."""
        await self._ready()
        async with self.transaction() as tx:
            await tx.execute(PUT_SQL, put_params(entry))
            if prune:
                await tx.execute(PRUNE_SQL, (JOBS_KEPT,))

    async def jobs(self, limit: int, job_id: str | None = None) -> list[dict[str, Any]]:
        """The ``limit`` most recently updated rows of ``_blockx_jobs`` (only
        ``job_id``'s when given), as the database holds them: a reader checks them."""
        if not self.read_only:
            await self._ready()
        sql, params = (NEWEST_SQL, (limit,)) if job_id is None else (ONE_SQL, (job_id,))
        async with self.transaction() as tx:
            if self.read_only and await tx.taken(JOBS_TABLE) is None:
                return []
            return await tx.fetch(sql, params)

    async def code_of(
        self, table: str, block_number: int, chain_id: int | None = None
    ) -> list[BlockCode]:
        """What wrote ``block_number`` of ``table`` (of the chain ``chain_id`` when
        given, else of every chain that wrote it, by chain id): each ledger entry
        with the code its task ran (``blockx_chain.sink.code``)."""
        identifier(table, "table")
        chain = None if chain_id is None else _chain_id(chain_id)
        if isinstance(block_number, bool) or not isinstance(block_number, int):
            raise SinkRejected(f"block number {block_number!r} is no block number")
        async with self._code_reader() as (tx, coded):
            if tx is None:
                return []
            return await sink_code.read_block_code(tx, table, block_number, chain, coded=coded)

    async def code_of_task(self, task_id: str) -> WrittenCode | None:
        """The code the task ``task_id`` ran; None when the sink keeps none for it."""
        async with self._code_reader() as (tx, coded):
            return await sink_code.read_task_code(tx, task_id) if tx and coded else None

    async def code_by_digest(self, digest: str) -> WrittenCode | None:
        """The module set of digest ``digest``; None when the sink does not hold it."""
        async with self._code_reader() as (tx, coded):
            return await sink_code.read_code(tx, digest) if tx and coded else None

    @contextlib.asynccontextmanager
    async def _code_reader(self) -> AsyncIterator[tuple[SinkTx | None, bool]]:
        """A transaction that reads the ledger and the code, and whether the sink
        keeps code (a read-only store: None on a sink without a ledger);
        SinkRejected while the sink's rows do not say their chain."""
        if not self.read_only:
            await self._ready()
        async with self.transaction() as tx:
            if not self.read_only:
                await self._marked(tx, None)
                yield tx, True
                return
            columns = await tx.column_names(LEDGER)
            if columns and CHAIN_ID not in columns:
                raise SinkRejected(
                    f"{self.description} holds rows written before sink rows carried their "
                    "chain: write it once with this BlockX (blockx backfill or follow)"
                )
            coded = await tx.taken(sink_code.TASK_CODE_TABLE) is not None
            yield (tx if columns else None), coded

    async def _ready(self) -> None:
        """Once per store, in a transaction of its own: the writers' tables made,
        the sink's identity made when it has none, its layout brought up to date."""
        if self._meta_ready:
            return
        if self.read_only:
            raise SinkRejected(f"{self.description} is open read-only")
        async with self._meta_turn:
            if not self._meta_ready:
                await self._make_meta()
                self._meta_ready = True

    async def _make_meta(self) -> None:
        async with self.transaction() as tx:
            await tx.lock([_META_LOCK])
            for statement in _meta_statements(tx.postgres):
                await tx.execute(statement)
            await sink_code.make_code_tables(tx)
            rows = await tx.fetch(f"SELECT version FROM {SINK_TABLE}", ())
            if not rows:
                await tx.execute(
                    f"INSERT INTO {SINK_TABLE} (identity, version) VALUES (?, ?)",
                    (str(uuid.uuid4()), 0),
                )
            version = rows[0]["version"] if rows else 0
            if version < INDEXES_VERSION:
                await _rename_legacy_indexes(tx)
                await tx.execute(f"UPDATE {SINK_TABLE} SET version = ?", (INDEXES_VERSION,))
            if version < LAYOUT_VERSION:
                if await _rows_without_chain(tx):
                    self._unmarked = True
                else:
                    await _mark_chain(tx, None)

    async def _known(self, tx: SinkTx, table: str) -> dict[str, SinkType]:
        rows = await tx.fetch(
            f"SELECT column_name, column_type FROM {COLUMNS_TABLE} WHERE table_name = ?",
            (table,),
        )
        return {r["column_name"]: SinkType(r["column_type"]) for r in rows}

    async def _columns(
        self,
        tx: SinkTx,
        table: str,
        declared: Mapping[str, SinkType],
        brought: Mapping[str, Values],
        key: Sequence[str],
    ) -> Plan:
        """The table once it holds every column the write brings, each as wide as
        its values need."""
        known = await self._known(tx, table)
        needed = plan(table, known, declared, brought, max_columns=tx.max_columns)
        if needed.added or needed.widened:
            # Another writer may be changing the same table: take turns, then look again.
            await tx.lock([f"{table}:schema"])
            known = await self._known(tx, table)
            needed = plan(table, known, declared, brought, max_columns=tx.max_columns)
            await self._apply(tx, table, known, needed, key)
        for name in key:
            identifier(name, "key column")
            if name not in needed.types:
                raise SinkRejected(f"key column {name!r} of table {table!r} is in no row")
        return needed

    async def _apply(
        self,
        tx: SinkTx,
        table: str,
        known: Mapping[str, SinkType],
        needed: Plan,
        key: Sequence[str],
    ) -> None:
        quoted = identifier(table, "table")
        pg = tx.postgres
        if needed.added and not known:
            await _claim(tx, table)
            for name in key:
                if name not in needed.types:
                    raise SinkRejected(f"key column {name!r} of table {table!r} is in no row")
            body = ", ".join(
                f"{identifier(name, 'column')} {sql_type(kind, pg)}" for name, kind in needed.added
            )
            await tx.execute(f"CREATE TABLE {quoted} ({body})")
            key_list = ", ".join(identifier(name, "key column") for name in key)
            await tx.execute(
                f'CREATE UNIQUE INDEX "{index_name("ux", table, key)}" ON {quoted} ({key_list})'
            )
            by_block = [CHAIN_ID, BLOCK_NUMBER]
            if BLOCK_NUMBER in needed.types and list(key[:2]) != by_block:
                await tx.execute(
                    f'CREATE INDEX "{index_name("ix", table, by_block)}" '
                    f"ON {quoted} (chain_id, block_number)"
                )
        else:
            for name, kind in needed.added:
                await tx.execute(
                    f"ALTER TABLE {quoted} ADD COLUMN {identifier(name, 'column')} "
                    f"{sql_type(kind, pg)}"
                )
        if needed.widened:
            await tx.widen(table, {name: new for name, _, new in needed.widened})
            await tx.executemany(
                f"UPDATE {COLUMNS_TABLE} SET column_type = ? WHERE table_name = ? "
                "AND column_name = ?",
                [(new.value, table, name) for name, _, new in needed.widened],
            )
        await tx.executemany(
            f"INSERT INTO {COLUMNS_TABLE} (table_name, column_name, column_type) VALUES (?, ?, ?)",
            [(table, name, kind.value) for name, kind in needed.added],
        )

    def _widened(self, table: str, needed: Plan) -> None:
        """Log each column the write widened (once it is committed: a widening is
        made once, and its cost, a rewrite of the table, is worth knowing)."""
        for name, old, new in needed.widened:
            log.warning(
                "%s: widened column %r of table %r from %s to %s (the table was rewritten)",
                self.description,
                name,
                table,
                old,
                new,
            )

    async def _insert(
        self,
        tx: SinkTx,
        table: str,
        types: Mapping[str, SinkType],
        batch: _Batch,
        key: Sequence[str],
        *,
        conflict: list[str] | None = None,
        stamps: Stamps | None = None,
    ) -> None:
        """Insert the batch's rows (with the ``stamps`` columns, which win over a
        row's own value), ``chunk_rows`` at a time."""
        if not batch.rows:
            return
        stamped = stamps.names if stamps is not None else ()
        names = [name for name in types if name in batch.brought or name in stamped]
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
        kinds = [types[n] for n in names]
        total = len(batch.rows)
        for start in range(0, total, self.chunk_rows):
            end = min(start + self.chunk_rows, total)
            encode = functools.partial(
                _encode_chunk, table, batch.rows, start, end, names, kinds, key, stamps, tx.postgres
            )
            await tx.insert(sql, encode, end - start)


class _Batch(NamedTuple):
    """A write's rows, checked: the column names they bring with their values, and
    for a block write each block's number, hash and count of rows, in row order."""

    rows: list[Mapping[str, Any]]
    brought: dict[str, Values]
    spans: list[tuple[int, str, int]]


class Stamps:
    """The columns a block writer stamps on a run of a write's rows: the chain id,
    each row's block number and hash, the code epoch, and (without a key) its index
    in its block."""

    def __init__(
        self,
        spans: list[tuple[int, str, int]],
        chain_id: int,
        code_epoch: int,
        *,
        with_row_index: bool,
    ) -> None:
        self._spans = spans
        self._starts = list(itertools.accumulate((count for _, _, count in spans), initial=0))
        self._chain_id = chain_id
        self._code_epoch = code_epoch
        self.names: tuple[str, ...] = (CHAIN_ID, BLOCK_NUMBER, BLOCK_HASH, CODE_EPOCH)
        if with_row_index:
            self.names += (ROW_INDEX,)

    def columns(self, start: int, end: int) -> dict[str, list[Any]]:
        """The stamp columns of rows ``[start, end)``."""
        numbers: list[int] = []
        hashes: list[str] = []
        indexes: list[int] = []
        span = bisect.bisect_right(self._starts, start) - 1
        while start < end:
            number, block_hash, count = self._spans[span]
            first = self._starts[span]
            stop = min(end, first + count)
            numbers.extend([number] * (stop - start))
            hashes.extend([block_hash] * (stop - start))
            indexes.extend(range(start - first, stop - first))
            start = stop
            span += 1
        stamped: dict[str, list[Any]] = {
            CHAIN_ID: [self._chain_id] * len(numbers),
            BLOCK_NUMBER: numbers,
            BLOCK_HASH: hashes,
            CODE_EPOCH: [self._code_epoch] * len(numbers),
        }
        if ROW_INDEX in self.names:
            stamped[ROW_INDEX] = indexes
        return stamped


def _encode_chunk(
    table: str,
    rows: list[Mapping[str, Any]],
    start: int,
    end: int,
    names: Sequence[str],
    kinds: Sequence[SinkType],
    key: Sequence[str],
    stamps: Stamps | None,
    postgres: bool,
) -> list[tuple[Any, ...]]:
    """Rows ``[start, end)`` as the database stores them (``encode_rows``)."""
    part = rows[start:end]
    stamped = stamps.columns(start, end) if stamps is not None else {}
    columns = [stamped[n] if n in stamped else [row.get(n) for row in part] for n in names]
    return encode_rows(table, kinds, names, columns, key, postgres)


async def _identity(tx: SinkTx) -> str:
    rows = await tx.fetch(f"SELECT identity FROM {SINK_TABLE}", ())
    identity: str = rows[0]["identity"]
    return identity


async def _version(tx: SinkTx) -> int:
    rows = await tx.fetch(f"SELECT version FROM {SINK_TABLE}", ())
    return int(rows[0]["version"])


async def _stamped_tables(tx: SinkTx) -> list[str]:
    """The tables a block writer made before rows carried their chain: the ones
    recorded with every stamp column but the chain id (and still there: one
    dropped by hand is left to its next write to report)."""
    stamps = [BLOCK_NUMBER, BLOCK_HASH, CODE_EPOCH, CHAIN_ID]
    rows = await tx.fetch(
        f"SELECT table_name, column_name FROM {COLUMNS_TABLE} "
        "WHERE column_name IN (?, ?, ?, ?) ORDER BY table_name",
        tuple(stamps),
    )
    columns: dict[str, set[str]] = {}
    for row in rows:
        columns.setdefault(row["table_name"], set()).add(row["column_name"])
    return [
        table
        for table, names in columns.items()
        if names == set(stamps[:3]) and await tx.column_names(table)
    ]


async def _rows_without_chain(tx: SinkTx) -> bool:
    """Whether the ledger or a stamped table holds a row without its chain id."""
    legacy = CHAIN_ID not in await tx.column_names(LEDGER)
    if legacy and await tx.fetch(f"SELECT 1 AS one FROM {LEDGER} LIMIT 1", ()):
        return True
    for table in await _stamped_tables(tx):
        if await tx.fetch(f"SELECT 1 AS one FROM {identifier(table, 'table')} LIMIT 1", ()):
            return True
    return False


async def _mark_chain(tx: SinkTx, chain_id: int | None) -> None:
    """The sink's ledger and stamped tables given the chain id, their rows marked
    as ``chain_id``'s (None: they hold none), and the layout version moved on."""
    pg = tx.postgres
    if CHAIN_ID not in await tx.column_names(LEDGER):
        # The key changes, which neither engine does in place: a copy replaces it.
        await tx.execute(_ledger_statement(pg, _LEDGER_REBUILT))
        if chain_id is not None:
            await tx.execute(
                f"INSERT INTO {_LEDGER_REBUILT} ({_LEDGER_COLUMNS}) SELECT table_name, ?, "
                f"block_number, block_hash, code_epoch, task_id, written_at_ms FROM {LEDGER}",
                (chain_id,),
            )
        await tx.execute(f"DROP TABLE {LEDGER}")
        await tx.execute(f"ALTER TABLE {_LEDGER_REBUILT} RENAME TO {LEDGER}")
        await tx.execute(sink_code.LEDGER_TASK_INDEX)
    for table in await _stamped_tables(tx):
        await _mark_table(tx, table, chain_id)
    await tx.execute(f"UPDATE {SINK_TABLE} SET version = ?", (LAYOUT_VERSION,))


async def _mark_table(tx: SinkTx, table: str, chain_id: int | None) -> None:
    """``table`` given the chain id column (its rows ``chain_id``'s), and its
    writers' indexes led by it."""
    quoted_table = identifier(table, "table")
    if CHAIN_ID in await tx.column_names(table):
        raise SinkRejected(
            f"table {table!r} has a column {CHAIN_ID!r} of its own, where the writers now "
            "record each row's chain: rename that column, then write again"
        )
    # A column added with a default gives every row that value without rewriting it.
    default = "" if chain_id is None else f" DEFAULT {chain_id}"
    kind = sql_type(SinkType.INTEGER, tx.postgres)
    await tx.execute(f"ALTER TABLE {quoted_table} ADD COLUMN chain_id {kind}{default}")
    if chain_id is not None and tx.postgres:
        await tx.execute(f"ALTER TABLE {quoted_table} ALTER COLUMN chain_id DROP DEFAULT")
    await tx.execute(
        f"INSERT INTO {COLUMNS_TABLE} (table_name, column_name, column_type) VALUES (?, ?, ?)",
        (table, CHAIN_ID, SinkType.INTEGER.value),
    )
    for index in await tx.table_indexes(table):
        kind_name = index.name.removeprefix("_blockx_")[:2]
        if index.name != index_name(kind_name, table, index.columns):
            continue  # not a writers' index
        unique = kind_name == "ux"
        if not unique and index.columns != [BLOCK_NUMBER]:
            continue
        led = [CHAIN_ID, *index.columns]
        listed = ", ".join(identifier(n, "column") for n in led)
        await tx.execute(f'DROP INDEX "{index.name}"')
        await tx.execute(
            f'CREATE {"UNIQUE " if unique else ""}INDEX "{index_name(kind_name, table, led)}" '
            f"ON {quoted_table} ({listed})"
        )


def _chain_id(value: Any) -> int:
    """``value`` checked as a chain id: a non-negative 64-bit int."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64[1]:
        raise SinkRejected(f"chain id {value!r} is no chain id (an integer from 0 to 2**63-1)")
    return value


async def _same_sink(tx: SinkTx, description: str, expected: str | None) -> None:
    """SinkMismatch when the writer was told to write the sink ``expected`` and this
    one has another identity."""
    if expected is None:
        return
    actual = await _identity(tx)
    if actual != expected:
        raise SinkMismatch(
            f"{description} is the sink with identity {actual}, but the task was given the "
            f"sink with identity {expected}: this Worker writes another sink database than "
            "the one its driver was given (compare the Workers' SINK_DB_URL with the "
            "driver's --sink-db or sink_db_url); nothing was written"
        )


async def _claim(tx: SinkTx, table: str) -> None:
    """SinkRejected when the name of a table about to be made is taken: by a sink
    table differing only by case, or by something the writers did not make."""
    twins = await tx.fetch(
        f"SELECT DISTINCT table_name FROM {COLUMNS_TABLE} "
        "WHERE lower(table_name) = lower(?) AND table_name <> ?",
        (table, table),
    )
    if twins:
        raise SinkRejected(
            f"table {table!r} differs only by case from the sink's table "
            f"{twins[0]['table_name']!r} (choose another table name)"
        )
    taken = await tx.taken(table)
    if taken is not None:
        raise SinkRejected(
            f"the sink database already has a {taken} named {table!r} that its writers did "
            "not make (choose another table name)"
        )


async def _rename_legacy_indexes(tx: SinkTx) -> None:
    """The writers' indexes of an older sink, renamed under ``_blockx_`` (an index
    is told from a user's by its name, the digest of its table and columns)."""
    for index in await tx.legacy_indexes():
        kind = index.name[:2]
        if index.name == index_name(kind, index.table, index.columns, legacy=True):
            await tx.rename_index(
                index, index_name(kind, index.table, index.columns), unique=kind == "ux"
            )


def _count(blocks: Any) -> int:
    """The rows of ``blocks``; 0 when it is malformed (checked inline, it says why)."""
    try:
        return sum(len(rows) for _, _, rows in blocks)
    except (TypeError, ValueError):
        return 0


def block_runs(numbers: Sequence[int]) -> list[tuple[int, int]]:
    """``numbers`` (distinct) as runs of consecutive numbers: ``(first, last)``."""
    runs: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def stamped_types(declared: dict[str, SinkType], *, with_row_index: bool) -> dict[str, SinkType]:
    stamps = {n: t for n, t in STAMP_TYPES.items() if n != ROW_INDEX or with_row_index}
    for name, kind in stamps.items():
        if name in declared and declared[name] is not kind:
            raise SinkRejected(f"column {name!r} is the writer's, always {kind}")
    return {**stamps, **declared}


def _brought(rows: Sequence[Any]) -> dict[str, Values] | None:
    """Each column the rows bring (in the order they first bring it) with its
    values; None when some row is no object of column names."""
    if not all(issubclass(kind, Mapping) for kind in set(map(type, rows))):
        return None
    names = dict.fromkeys(itertools.chain.from_iterable(rows))
    if not all(isinstance(name, str) for name in names):
        return None
    return {name: Values.of([row.get(name) for row in rows]) for name in names}


def block_batch(
    table: str,
    chain_id: int,
    blocks: Sequence[tuple[int, str, Sequence[Any]]],
    key: Sequence[str] | None,
) -> _Batch:
    """The rows of a block write, checked: SinkRejected naming the first row (in
    block and row order) that cannot be stamped, or a block given twice."""
    spans: list[tuple[int, str, int]] = []
    rows: list[Any] = []
    for number, block_hash, block_rows in blocks:
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise SinkRejected(f"block number {number!r} is no block number")
        if not isinstance(block_hash, str):
            raise SinkRejected(f"block {number}: hash {block_hash!r} is no text")
        spans.append((number, block_hash, len(block_rows)))
        rows.extend(block_rows)
    brought = _brought(rows)
    if brought is None or not _stampable(spans, rows, brought, key, chain_id):
        # Some row cannot be stamped: say which, the first in block and row order.
        for number, block_hash, block_rows in blocks:
            for row in block_rows:
                _check_stampable(table, row, chain_id, number, block_hash, key)
        raise AssertionError("_stampable refused rows _check_stampable accepts")  # pragma: no cover
    if len({number for number, _, _ in spans}) != len(spans):
        raise SinkRejected("replace_blocks was given the same block twice")
    return _Batch(rows, brought, spans)


def _upsert_batch(table: str, rows: Sequence[Any]) -> _Batch:
    brought = _brought(rows)
    if brought is None:
        for row in rows:
            _mapping(table, row)
        raise AssertionError("_brought refused rows _mapping accepts")  # pragma: no cover
    return _Batch(list(rows), brought, [])


def _stampable(
    spans: Sequence[tuple[int, str, int]],
    rows: Sequence[Mapping[str, Any]],
    brought: Mapping[str, Values],
    key: Sequence[str] | None,
    chain_id: int,
) -> bool:
    """Whether every row can be stamped (``_check_stampable`` says why not): none
    carries a chain id other than the write's, a block number or hash other than
    its block's, or a row_index without a key."""
    if not key and ROW_INDEX in brought:
        return False
    if CHAIN_ID in brought and any(row.get(CHAIN_ID) not in (None, chain_id) for row in rows):
        return False
    for name, position in ((BLOCK_NUMBER, 0), (BLOCK_HASH, 1)):
        if name not in brought:
            continue
        start = 0
        for span in spans:
            expected = span[position]
            for row in rows[start : start + span[2]]:
                own = row.get(name)
                if own is not None and own != expected:
                    return False
            start += span[2]
    return True


def _mapping(table: str, row: Any) -> Mapping[str, Any]:
    if not isinstance(row, Mapping) or not all(isinstance(k, str) for k in row):
        raise SinkRejected(f"a row of table {table!r} is no object of column names: {row!r:.80}")
    return row


def _check_stampable(
    table: str,
    row: Any,
    chain_id: int,
    number: int,
    block_hash: str,
    key: Sequence[str] | None,
) -> None:
    checked = _mapping(table, row)
    for name, expected in ((CHAIN_ID, chain_id), (BLOCK_NUMBER, number), (BLOCK_HASH, block_hash)):
        own = checked.get(name)
        if own is not None and own != expected:
            raise SinkRejected(
                f"a row of block {number} carries {name} {own!r}, not its call's {expected!r}"
            )
    if not key and ROW_INDEX in checked:
        raise SinkRejected(
            f"a row of table {table!r} carries {ROW_INDEX!r}, which the writer sets when no "
            "key is given (give a key, or rename the column)"
        )


# The ledger of blocks whose rows live outside the sink database (the lake's
# Iceberg tables): their writer keeps the ledger in one transaction of its own.


async def put_ledger(
    tx: SinkTx, table: str, chain_id: int, entries: Sequence[tuple[int, str, int, str, int]]
) -> set[str]:
    """Ledger entries ``(block_number, block_hash, code_epoch, task_id,
    written_at_ms)`` of ``table``'s chain ``chain_id``, replacing these blocks' own;
    the tasks the replaced entries named (for ``sink_code.blocks_written``)."""
    replaced = await drop_ledger(tx, table, chain_id, [entry[0] for entry in entries])
    await tx.executemany(
        f"INSERT INTO {LEDGER} ({_LEDGER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(table, chain_id, *entry) for entry in entries],
    )
    return replaced


async def drop_ledger(tx: SinkTx, table: str, chain_id: int, numbers: Sequence[int]) -> set[str]:
    """The ledger entries of these blocks of ``table``'s chain ``chain_id``,
    removed; the tasks they named."""
    runs = [(chain_id, low, high) for low, high in block_runs(numbers)]
    return await sink_code.unrecord_runs(tx, table, runs)
