"""What every block database store does, whatever its engine.

A store answers the function-visible reads and hands out writers. A writer is one
database transaction that only one process at a time may hold (PostgreSQL: an
advisory lock; SQLite: ``BEGIN IMMEDIATE``); a second one fails with WriterBusy
instead of waiting, so two ingests never interleave. Leaving ``async with
store.writer()`` commits, an exception rolls everything back.

Engines implement ``_fetch`` (rows as dicts keyed by column name) and the few
writer primitives below; the SQL is shared, with ``?`` placeholders.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec

from blockx_chain.schema import (
    ABIS,
    ABIS_SINCE,
    BLOCK_TABLES,
    BLOCKS,
    CHAIN,
    LOG_FILTER,
    LOG_FILTER_SINCE,
    REORGS,
    SCHEMA_VERSION,
    SEEN_AT,
    SEEN_AT_SINCE,
    TRACED,
    TRACES_SINCE,
    AbiRecord,
    BlockRows,
    ChainState,
    LogFilterRecord,
    Table,
    block_row_sets,
    chain_row,
    check_value,
)
from blockx_chain.store import reads
from blockx_chain.store.errors import ChainMismatch, NotHeld, StoreError

LOG_FILTER_SQL = "SELECT addresses, topic0s, from_block FROM log_filter"


def log_filter_row(row: dict[str, Any]) -> LogFilterRecord:
    return LogFilterRecord(
        addresses=tuple(msgspec.json.decode(row["addresses"])),
        topic0s=tuple(msgspec.json.decode(row["topic0s"])),
        from_block=row["from_block"],
    )


ABIS_SQL = "SELECT name, abi, addresses, revision FROM abis ORDER BY name"
# What changes with every change of the registry: ``revision`` only grows, and a
# removal alone lowers the count.
ABIS_REVISION_SQL = "SELECT count(*) AS count, coalesce(max(revision), 0) AS revision FROM abis"


def abi_row(row: dict[str, Any]) -> AbiRecord:
    return AbiRecord(
        name=row["name"],
        abi=msgspec.json.decode(row["abi"]),
        addresses=tuple(msgspec.json.decode(row["addresses"])),
        revision=row["revision"],
    )


def block_columns(table: Table) -> tuple[str, ...]:
    """The columns insert_blocks loads into block table ``table``, in its rows' order
    (``blocks`` rows end with when ingest stored them)."""
    return (*table.names, SEEN_AT.name) if table is BLOCKS else table.names


def check_chain(current: ChainState, chain_id: int, genesis_hash: str) -> None:
    """ChainMismatch when the database holds another chain than the node's."""
    if (current.chain_id, current.genesis_hash) != (chain_id, genesis_hash):
        raise ChainMismatch(
            f"the block database holds chain {current.chain_id} (genesis "
            f"{current.genesis_hash}), not chain {chain_id} (genesis {genesis_hash})"
        )


class BlockWriter(abc.ABC):
    """The writes of one ingest transaction."""

    @abc.abstractmethod
    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one statement; the number of rows it changed."""

    @abc.abstractmethod
    async def _delete_blocks(self, numbers: list[int]) -> None:
        """Remove every row of the block tables at these block numbers."""

    @abc.abstractmethod
    async def _load(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        """Bulk-insert checked rows."""

    async def chain(self) -> ChainState | None:
        rows = await self._fetch(reads.CHAIN_SQL, ())
        return chain_row(rows[0]) if rows else None

    async def mark_traces(self) -> None:
        """Record that this database holds traces: every later ingest traces too."""
        await self._execute(f"UPDATE chain SET {TRACED.name} = 1", ())

    async def init_chain(self, chain_id: int, genesis_hash: str) -> ChainState:
        """The chain row, made on an empty database; ChainMismatch when the database
        holds another chain."""
        chain_id = check_value(CHAIN, CHAIN.columns[0], chain_id, "init_chain")
        genesis_hash = check_value(CHAIN, CHAIN.columns[1], genesis_hash, "init_chain")
        current = await self.chain()
        if current is None:
            await self._execute(
                "INSERT INTO chain (chain_id, genesis_hash, head_number, head_hash, "
                "finalized_number, epoch) VALUES (?, ?, NULL, NULL, NULL, 0)",
                (chain_id, genesis_hash),
            )
            return ChainState(
                chain_id=chain_id,
                genesis_hash=genesis_hash,
                head_number=None,
                head_hash=None,
                finalized_number=None,
                epoch=0,
            )
        check_chain(current, chain_id, genesis_hash)
        return current

    async def log_filter(self) -> LogFilterRecord | None:
        """The filter a selective ingest made the database with; None for a database
        of whole blocks (or an empty one)."""
        rows = await self._fetch(LOG_FILTER_SQL, ())
        return log_filter_row(rows[0]) if rows else None

    async def set_log_filter(self, record: LogFilterRecord) -> None:
        """Record (or move down the ``from_block`` of) the database's filter."""
        values = (list(record.addresses), list(record.topic0s), record.from_block)
        checked = tuple(
            check_value(LOG_FILTER, c, v, "set_log_filter")
            for c, v in zip(LOG_FILTER.columns, values, strict=True)
        )
        changed = await self._execute(
            "UPDATE log_filter SET addresses = ?, topic0s = ?, from_block = ?", checked
        )
        if changed == 0:
            await self._execute(
                "INSERT INTO log_filter (addresses, topic0s, from_block) VALUES (?, ?, ?)",
                checked,
            )

    async def put_abi(self, name: str, abi: list[Any], addresses: Sequence[str]) -> AbiRecord:
        """Register (or replace) the ABI ``name``: its entries as ABI JSON and the
        contracts it decodes (empty: any). The row gets the next revision."""
        rows = await self._fetch(ABIS_REVISION_SQL, ())
        revision = int(rows[0]["revision"]) + 1
        record = AbiRecord(
            name=name, abi=abi, addresses=tuple(sorted(set(addresses))), revision=revision
        )
        values = (record.name, record.abi, list(record.addresses), record.revision)
        checked = tuple(
            check_value(ABIS, c, v, "put_abi") for c, v in zip(ABIS.columns, values, strict=True)
        )
        await self._execute("DELETE FROM abis WHERE name = ?", (name,))
        await self._execute(
            "INSERT INTO abis (name, abi, addresses, revision) VALUES (?, ?, ?, ?)", checked
        )
        return record

    async def remove_abi(self, name: str) -> bool:
        """Unregister the ABI ``name``; whether there was one."""
        return await self._execute("DELETE FROM abis WHERE name = ?", (name,)) > 0

    async def delete_between(self, first: int, last: int) -> None:
        """Remove every row of blocks ``first..last`` (a selective ingest rewrites a
        range whole: a block it finds no log in keeps none)."""
        start, end = reads.block_range(first, last)
        for table in BLOCK_TABLES:
            await self._execute(
                f"DELETE FROM {table.name} WHERE block_number BETWEEN ? AND ?", (start, end)
            )

    async def insert_blocks(
        self, blocks: Sequence[BlockRows], *, seen_at_ms: int | None = None
    ) -> dict[str, int]:
        """Write these blocks with their transactions and logs, and the ERC-20
        transfers among the logs, replacing whatever the database held at those
        block numbers (so re-running a range leaves the same rows). ``seen_at_ms``
        is when ingest stored them (Unix ms; None: not known). Every row is checked
        first: a RowError writes nothing. Returns the rows written per table."""
        if not blocks:
            return {t.name: 0 for t in BLOCK_TABLES}
        seen = check_value(BLOCKS, SEEN_AT, seen_at_ms, "insert_blocks")
        numbers = [b.block.block_number for b in blocks]
        if len(set(numbers)) != len(numbers):
            raise StoreError("insert_blocks was given the same block number twice")

        def checked() -> dict[str, list[tuple[Any, ...]]]:
            rows = block_row_sets(blocks)
            rows[BLOCKS.name] = [(*row, seen) for row in rows[BLOCKS.name]]
            return rows

        rows = await self._replace_blocks(numbers, checked)
        return {name: len(table_rows) for name, table_rows in rows.items()}

    async def _replace_blocks(
        self, numbers: list[int], checked: Callable[[], dict[str, list[tuple[Any, ...]]]]
    ) -> dict[str, list[tuple[Any, ...]]]:
        """Delete the rows of blocks ``numbers`` and load ``checked()``'s, the rows of
        every block table (RowError from ``checked`` writes nothing more). Checking
        every cell is CPU work: it runs off the event loop, so fetches of the next
        batches go on meanwhile."""
        rows = await asyncio.to_thread(checked)
        await self._delete_blocks(numbers)
        for table in BLOCK_TABLES:
            if rows[table.name]:
                await self._load(table.name, block_columns(table), rows[table.name])
        return rows

    async def delete_above(self, number: int) -> int:
        """Remove every row of blocks above ``number``; the number of blocks removed."""
        number = reads.block_number(number, "number")
        removed = 0
        for table in BLOCK_TABLES:
            count = await self._execute(
                f"DELETE FROM {table.name} WHERE block_number > ?", (number,)
            )
            if table is BLOCKS:
                removed = count
        return removed

    async def block_hashes(self, from_block: int, to_block: int) -> dict[int, str]:
        """Stored block hashes in the range, for checking continuity and finding a fork."""
        start, end = reads.block_range(from_block, to_block)
        rows = await self._fetch(
            "SELECT block_number, block_hash FROM blocks WHERE block_number BETWEEN ? AND ?",
            (start, end),
        )
        return {row["block_number"]: row["block_hash"] for row in rows}

    async def record_reorg(
        self,
        *,
        detected_at_ms: int,
        fork_block_number: int,
        depth: int,
        old_head_hash: str,
        new_head_hash: str,
    ) -> int:
        """Append to ``reorgs``; the new row's id (ids only grow)."""
        values = {
            "detected_at_ms": detected_at_ms,
            "fork_block_number": fork_block_number,
            "depth": depth,
            "old_head_hash": old_head_hash,
            "new_head_hash": new_head_hash,
        }
        checked = tuple(
            check_value(REORGS, c, values[c.name], "record_reorg") for c in REORGS.columns[1:]
        )
        rows = await self._fetch(
            "INSERT INTO reorgs (detected_at_ms, fork_block_number, depth, old_head_hash, "
            "new_head_hash) VALUES (?, ?, ?, ?, ?) RETURNING id",
            checked,
        )
        reorg_id: int = rows[0]["id"]
        return reorg_id

    async def set_chain(
        self,
        *,
        head_number: int | None,
        head_hash: str | None,
        finalized_number: int | None,
        epoch: int,
    ) -> None:
        values = (head_number, head_hash, finalized_number, epoch)
        checked = tuple(
            check_value(CHAIN, c, v, "set_chain")
            for c, v in zip(CHAIN.columns[2:], values, strict=True)
        )
        changed = await self._execute(
            "UPDATE chain SET head_number = ?, head_hash = ?, finalized_number = ?, epoch = ?",
            checked,
        )
        if changed != 1:
            raise StoreError("set_chain before init_chain: the database has no chain row")


class BlockStore(abc.ABC):
    """One block database: reads, and ``writer()`` for ingest."""

    def __init__(self, description: str, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.description = description
        self.max_rows = max_rows
        # The schema of the database, for a reader of one a version older (its
        # writer migrates it; until then ``seen_at`` knows no times).
        self.schema_version = SCHEMA_VERSION
        # Once the database has its chain row, its filter (or none) never changes.
        self._log_filter: LogFilterRecord | None = None
        self._log_filter_known = False

    @abc.abstractmethod
    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def writer(self) -> AbstractAsyncContextManager[BlockWriter]:
        """One transaction of writes; WriterBusy when another writer holds the database."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[asyncio.Event | None]:
        """Push from the database: an Event a writer's commit sets (the reader clears
        it before it reads), or None where the engine pushes nothing (the reader
        polls). It only wakes: what changed is read from the database."""
        yield None

    async def _layout(self) -> reads.Layout:
        """The columns of a database older than this BlockX's schema, or None (the
        current schema: every read selects every column)."""
        return None

    async def _read(self, read: reads.Read) -> list[dict[str, Any]]:
        return read.check(await self._fetch(read.sql, read.params))

    async def head(self) -> dict[str, Any] | None:
        """``{"number", "hash", "finalized"}``; None while nothing is ingested."""
        rows = await self._fetch(reads.HEAD_SQL, ())
        if not rows or rows[0]["head_number"] is None:
            return None
        row = rows[0]
        return {
            "number": row["head_number"],
            "hash": row["head_hash"],
            "finalized": row["finalized_number"],
        }

    async def block_range(self) -> tuple[int, int] | None:
        """The lowest and highest block held; None while nothing is ingested."""
        rows = await self._fetch(
            "SELECT MIN(block_number) AS low, MAX(block_number) AS high FROM blocks", ()
        )
        if not rows or rows[0]["low"] is None:
            return None
        return int(rows[0]["low"]), int(rows[0]["high"])

    async def chain(self) -> ChainState | None:
        """The chain row (epoch, finalized, head); None on an empty database."""
        rows = await self._fetch(reads.CHAIN_SQL, ())
        return chain_row(rows[0]) if rows else None

    async def log_filter(self) -> LogFilterRecord | None:
        """The filter a selective ingest made the database with; None for a database
        of whole blocks, or one nothing was ingested into yet."""
        if self._log_filter_known:
            return self._log_filter
        if self.schema_version < LOG_FILTER_SINCE:
            return None
        rows = await self._fetch(LOG_FILTER_SQL, ())
        record = log_filter_row(rows[0]) if rows else None
        if record is not None or await self.chain() is not None:
            self._log_filter, self._log_filter_known = record, True
        return record

    async def _holds(self, table: str, where: dict[str, Any] | None = None) -> None:
        """NotHeld for a read of what a selective database does not hold."""
        record = await self.log_filter()
        if record is None:
            return
        if table not in ("blocks", "logs", "erc20_transfers"):
            raise NotHeld(
                f"the block database holds only {record.describe()} (made by "
                f"`blockx chain ingest --logs`): it has no {table}; read them from a "
                "database of whole blocks"
            )
        for column in ("address", "token"):
            value = (where or {}).get(column)
            if (
                isinstance(value, str)
                and record.addresses
                and value.lower() not in record.addresses
            ):
                raise NotHeld(
                    f"the block database holds only {record.describe()}: "
                    f"{table} of {value.lower()} are not in it"
                )
        topic0 = (where or {}).get("topic0")
        if isinstance(topic0, str) and record.topic0s and topic0.lower() not in record.topic0s:
            raise NotHeld(
                f"the block database holds only {record.describe()}: "
                f"logs with topic0 {topic0.lower()} are not in it"
            )

    async def block(self, number: Any) -> dict[str, Any] | None:
        rows = await self._read(reads.block(number, await self._layout()))
        return rows[0] if rows else None

    async def blocks(self, from_block: Any, to_block: Any) -> list[dict[str, Any]]:
        return await self._read(
            reads.blocks(from_block, to_block, self.max_rows, await self._layout())
        )

    async def hashes(self, from_block: Any, to_block: Any) -> list[dict[str, Any]]:
        """``{"block_number", "block_hash"}`` of each block of the range, as ``blocks``
        reads them: what checking a range is canonical needs, without the rest."""
        return await self._read(reads.hashes(from_block, to_block, self.max_rows))

    async def transactions(self, block_number: Any) -> list[dict[str, Any]]:
        read = reads.transactions(block_number, self.max_rows, await self._layout())
        await self._holds("transactions")
        return await self._read(read)

    async def logs(
        self, from_block: Any, to_block: Any = None, address: Any = None, topic0: Any = None
    ) -> list[dict[str, Any]]:
        layout = await self._layout()
        read = reads.logs(from_block, to_block, address, topic0, self.max_rows, layout)
        await self._holds("logs", {"address": address, "topic0": topic0})
        return await self._read(read)

    async def erc20_transfers(
        self, from_block: Any, to_block: Any = None, token: Any = None
    ) -> list[dict[str, Any]]:
        layout = await self._layout()
        read = reads.erc20_transfers(from_block, to_block, token, self.max_rows, layout)
        await self._holds("erc20_transfers", {"token": token})
        return await self._read(read)

    async def rows(
        self, table: Any, from_block: Any, to_block: Any = None, where: Any = None
    ) -> list[dict[str, Any]]:
        """Rows of block table ``table`` (any of schema.BLOCK_TABLES) in
        ``[from_block, to_block]`` whose columns equal ``where``'s values, ordered by
        the table's key (block, then index)."""
        layout = await self._layout()
        read = reads.rows(table, from_block, to_block, where, self.max_rows, layout)
        await self._holds(table, where)
        return await self._read(read)

    async def seen_at(self, from_block: int, to_block: int) -> dict[int, int | None]:
        """When ingest stored each block in ``[from_block, to_block]`` (Unix ms; None
        for a block stored before the database recorded it). Not a function read."""
        start, end = reads.block_range(from_block, to_block)
        seen = SEEN_AT.name if self.schema_version >= SEEN_AT_SINCE else "NULL"
        rows = await self._fetch(
            f"SELECT block_number, {seen} AS seen FROM blocks WHERE block_number BETWEEN ? AND ?",
            (start, end),
        )
        return {row["block_number"]: row["seen"] for row in rows}

    async def holds_traces(self) -> bool:
        """Whether traces were ingested into this database. Not a function read."""
        if self.schema_version < TRACES_SINCE:
            return False
        rows = await self._fetch(f"SELECT {TRACED.name} FROM chain", ())
        return bool(rows and rows[0][TRACED.name])

    async def abis(self) -> list[AbiRecord]:
        """The ABI registry, by name (``blockx chain abi``). Not a function read."""
        if self.schema_version < ABIS_SINCE:
            await self._layout()
        if self.schema_version < ABIS_SINCE:
            return []
        return [abi_row(row) for row in await self._fetch(ABIS_SQL, ())]

    async def abis_revision(self) -> tuple[int, int]:
        """``(count, highest revision)`` of the registry: different after any change,
        so a reader re-reads the ABIs only then."""
        if self.schema_version < ABIS_SINCE:
            await self._layout()  # a reader notices the file migrated under it
        if self.schema_version < ABIS_SINCE:
            return (0, 0)
        row = (await self._fetch(ABIS_REVISION_SQL, ()))[0]
        return (int(row["count"]), int(row["revision"]))

    async def reorgs(self, after_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Reorgs with an id above ``after_id``, oldest first: a follower's cursor."""
        return await self._fetch(reads.REORGS_SQL, (after_id, limit))
