"""LakeStore: Iceberg tables under one catalog, written block by block like a sink.

``replace_blocks`` answers as ``SinkStore.replace_blocks`` does, with the rows in
an Iceberg table instead of a SQL one. One call is one catalog commit: the
table made from the rows' schema (or the declared columns) when missing and
given the columns a write brings, the rows stamped with chain_id, block_number,
block_hash, code_epoch (and row_index without a key), written by an overwrite
whose filter is (chain_id = the chain, block_number in the blocks written), so a
re-run or a rewritten block replaces exactly that block's rows. A table is
partitioned by chain and by ranges of PARTITION_BLOCKS block numbers.

Every commit carries what it did in its snapshots' summary properties
(``blockx.chain-id``, ``blockx.blocks``: the blocks and their hashes, or
``blockx.deleted``; ``blockx.task-id``, ``blockx.code-epoch``,
``blockx.written-at-ms``). The ledger (``_blockx_written``), the sink identity
and the drivers' job records live in a SQL database beside the catalog (a SQL
catalog's own), a ``SinkStore`` (``self.ledger``): the drivers read them there
exactly as for a SQL sink. After its commit, a write brings the ledger up to the
table's newest snapshot: every snapshot newer than the last one applied
(``_blockx_lake`` records its sequence number per table) is applied in order, so
a crash between a commit and its ledger (or a writer that never got there) is
made good by the next write, by ``catch_up`` (before the ledger is read, and for
every table when a store opens), whoever runs it. Snapshots are expired as part
of the writes (only ones already in the ledger): a table keeps at most
twice KEEP_SNAPSHOTS snapshots.

Several writers commit at once optimistically: a commit that lost the race
(CommitFailedException, or a SQLite catalog busy) is made again from the table's
new state, with back-off, up to COMMIT_ATTEMPTS times. One store commits to a
table one write at a time (its writers would only lose the race to each other).

pyiceberg blocks: every catalog and file operation runs on the store's threads.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec

from blockx_chain.lake.columns import (
    arrow_table,
    decimals,
    doc,
    encoded,
    iceberg_type,
    scale_of,
    sink_types,
)
from blockx_chain.lake.config import CATALOG_NAME, LakeConfig
from blockx_chain.sink import SinkMismatch, SinkRejected, SinkStore, SinkUnavailable, open_sink
from blockx_chain.sink import code as sink_code
from blockx_chain.sink.base import (
    Stamps,
    block_batch,
    block_runs,
    drop_ledger,
    put_ledger,
    stamped_types,
)
from blockx_chain.sink.errors import SinkError
from blockx_chain.sink.schema import (
    BLOCK_NUMBER,
    CHAIN_ID,
    INT64,
    SinkType,
    parse_types,
    plan,
    writable_table,
)
from blockx_chain.sink.tx import SinkTx
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl, describe, parse_blockdb_url
from blockx_core.backoff import Backoff

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table, Transaction
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

T = TypeVar("T")

LAKE_TABLE: Final = "_blockx_lake"
# ``_blockx_lake``'s name of a SQL catalog on the ledger's own database.
LEDGER_CATALOG: Final = "sql:ledger"
# Block numbers per partition of a table (Iceberg's truncate transform).
PARTITION_BLOCKS: Final = 100_000
# Snapshots a table keeps at least; more than twice as many are expired down to it.
KEEP_SNAPSHOTS: Final = 16
COMMIT_ATTEMPTS: Final = 8
COMMIT_BACKOFF: Final = Backoff(initial_s=0.02, max_s=1.0)
# The most columns a lake table may have.
MAX_COLUMNS: Final = 1000
# The most tables a store catches up when it opens.
MAX_TABLES: Final = 1000
_PREFIX: Final = "blockx."
# A commit that lost the race is made again by this store from the table's new
# state (its filter, its expiry, its schema), never re-based by pyiceberg.
TABLE_PROPERTIES: Final = {"commit.retry.num-retries": "0"}

# pyiceberg warns when an overwrite's filter matches no rows: the usual first write.
warnings.filterwarnings("ignore", message="Delete operation did not match any records")


class TooManyRows(SinkRejected):
    """A scan would answer more rows than the store's ``max_rows``."""


class _Change(msgspec.Struct, frozen=True, kw_only=True):
    """What one commit did, as its snapshots' summary properties say."""

    chain_id: int
    blocks: list[tuple[int, str]] = []
    deleted: list[int] = []
    code_epoch: int = 0
    task_id: str = ""
    written_at_ms: int = 0
    write: str = ""

    def properties(self) -> dict[str, str]:
        said = {
            "chain-id": str(self.chain_id),
            "code-epoch": str(self.code_epoch),
            "task-id": self.task_id,
            "written-at-ms": str(self.written_at_ms),
            "write": self.write,
        }
        if self.blocks:
            said["blocks"] = msgspec.json.encode(self.blocks).decode()
        if self.deleted:
            said["deleted"] = msgspec.json.encode(self.deleted).decode()
        return {_PREFIX + key: value for key, value in said.items()}

    @classmethod
    def of(cls, summary: Mapping[str, str]) -> _Change | None:
        """The change a snapshot's summary records; None for a snapshot this writer
        did not make (or whose properties cannot be read: logged)."""
        if _PREFIX + "chain-id" not in summary:
            return None
        try:
            return cls(
                chain_id=int(summary[_PREFIX + "chain-id"]),
                blocks=_decode(summary.get(_PREFIX + "blocks", "[]"), list[tuple[int, str]]),
                deleted=_decode(summary.get(_PREFIX + "deleted", "[]"), list[int]),
                code_epoch=int(summary.get(_PREFIX + "code-epoch", "0")),
                task_id=summary.get(_PREFIX + "task-id", "")[:200],
                written_at_ms=int(summary.get(_PREFIX + "written-at-ms", "0")),
                write=summary.get(_PREFIX + "write", "")[:64],
            )
        except (ValueError, msgspec.ValidationError, msgspec.DecodeError) as exc:
            log.warning("a lake snapshot's blockx properties cannot be read: %s", exc)
            return None

    async def apply(self, tx: SinkTx, table: str) -> set[str]:
        """The change made in the ledger; the tasks of the entries it replaced."""
        replaced: set[str] = set()
        if self.deleted:
            replaced |= await drop_ledger(tx, table, self.chain_id, self.deleted)
        if self.blocks:
            entry = (self.code_epoch, self.task_id, self.written_at_ms)
            entries = [(n, h, *entry) for n, h in self.blocks]
            replaced |= await put_ledger(tx, table, self.chain_id, entries)
        return replaced


def _decode(text: str, kind: Any) -> Any:
    return msgspec.json.decode(text.encode(), type=kind)


class LakeStore:
    """Iceberg tables of one namespace of one catalog, with their ledger."""

    def __init__(self, config: LakeConfig, catalog: Catalog, ledger: SinkStore) -> None:
        self.config = config
        self.catalog = catalog
        self.ledger = ledger
        self.namespace = config.namespace
        self.max_rows = config.max_rows
        target = config.uri if config.catalog_type != "sql" else describe(config.ledger())
        self.description = f"the lake {config.namespace!r} ({config.catalog_type} catalog {target})"
        self._threads = ThreadPoolExecutor(4, thread_name_prefix="lake")
        self._registered: set[str] = set()
        # The module sets this store knows the ledger's database holds.
        self._code_known: set[str] = set()
        # One commit of a table at a time from this store: its writers would only
        # lose the race to each other (and write their files again).
        self._turns: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(cls, config: LakeConfig, *, read_only: bool = False) -> LakeStore:
        """The lake ``config`` names (LakeConfigError for a configuration that cannot
        work, SinkUnavailable for a catalog or ledger that does not answer), its
        tables' ledgers brought up to date. ``read_only``: a store for scans alone
        (the Sync Invoker's), which makes nothing: no catalog tables, namespace,
        ledger tables or ledger rows (and no missing SQLite ledger file)."""
        properties = config.catalog_properties()
        if read_only:
            properties["init_catalog_tables"] = "false"
        ledger = await open_sink(config.ledger(), read_only=read_only)
        try:
            if not read_only:
                await ledger.identity()  # the writers' tables, made
                async with ledger.transaction() as tx:
                    await tx.execute(
                        f"CREATE TABLE IF NOT EXISTS {LAKE_TABLE} (table_name TEXT NOT NULL "
                        "PRIMARY KEY, namespace TEXT NOT NULL, catalog TEXT NOT NULL, "
                        "applied_sequence BIGINT NOT NULL)"
                    )
            loop = asyncio.get_running_loop()
            catalog = await loop.run_in_executor(
                None, _catalog, properties, None if read_only else config.namespace
            )
            store = cls(config, catalog, ledger)
            if not read_only:
                await store.catch_up()
        except BaseException:
            await ledger.close()
            raise
        return store

    async def close(self) -> None:
        await self.ledger.close()
        # A SQL catalog's connection pool (other catalogs hold none to release).
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            await self._run(engine.dispose)
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def identity(self) -> str:
        return await self.ledger.identity()

    async def _run(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, work)

    def _identifier(self, table: str) -> tuple[str, str]:
        return (self.namespace, table)

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
        """As ``SinkStore.replace_blocks``, into the Iceberg table ``table``: one
        commit, then the ledger (with the task's code, ``blockx_chain.sink.code``,
        in the ledger's database). Returns the blocks and rows written, and the id
        of the table's snapshot after the commit (``snapshot_id``, 0: nothing
        written)."""
        writable_table(table)
        chain_id = _chain_id(chain_id)
        code = sink_code.checked_code(code_digest, code_sources, code_epoch, task_id)
        declared = stamped_types(parse_types(columns), with_row_index=not key)
        batch = await self._run(functools.partial(block_batch, table, chain_id, blocks, key))
        numbers = [number for number, _, _ in batch.spans]
        if sink_identity is not None:
            await self._same_sink(sink_identity)
        if not numbers:
            return {"blocks": 0, "rows": 0, "snapshot_id": 0}
        await self._claim(chain_id if claim_unmarked else None)
        marker = await self._register(table)
        change = _Change(
            chain_id=chain_id,
            blocks=[(n, h) for n, h, _ in batch.spans],
            code_epoch=code_epoch,
            task_id=task_id,
            written_at_ms=now_ms,
            write=uuid.uuid4().hex,
        )
        stamps = Stamps(batch.spans, chain_id, code_epoch, with_row_index=not key)
        write = functools.partial(
            self._write, table, declared, batch.rows, batch.brought, stamps, key, change, marker
        )
        metadata = await self._commit(table, write)
        snapshot_id = await self._apply(table, metadata, change, code)
        return {"blocks": len(numbers), "rows": len(batch.rows), "snapshot_id": snapshot_id}

    async def delete_blocks(self, table: str, chain_id: int, numbers: Sequence[int]) -> int:
        """In one commit, remove ``table``'s rows of these blocks of the chain
        ``chain_id`` (blocks that left the canonical chain), then their ledger
        entries. Returns the ledger entries removed."""
        writable_table(table)
        chain_id = _chain_id(chain_id)
        wanted = sorted(set(numbers))
        if not wanted:
            return 0
        present = {
            row["block_number"]
            for row in await self.written(table, chain_id, wanted[0], wanted[-1])
            if row["block_number"] in set(wanted)
        }
        marker = await self._register(table)
        change = _Change(chain_id=chain_id, deleted=wanted, write=uuid.uuid4().hex)
        metadata = await self._commit(table, functools.partial(self._delete, table, change, marker))
        await self._apply(table, metadata, change)
        return len(present)

    async def written(
        self,
        table: str,
        chain_id: int,
        from_block: int | None = None,
        to_block: int | None = None,
    ) -> list[dict[str, Any]]:
        """The ledger of ``table`` (``SinkStore.written``), brought up to date first."""
        await self.catch_up(table)
        return await self.ledger.written(table, chain_id, from_block, to_block)

    async def catch_up(self, table: str | None = None) -> None:
        """The ledger of ``table`` (of every table of the lake without it) brought
        up to the table's newest snapshot."""
        if table is not None:
            names = [table]
        else:
            async with self.ledger.transaction() as tx:
                rows = await tx.fetch(
                    f"SELECT table_name FROM {LAKE_TABLE} WHERE namespace = ? LIMIT ?",
                    (self.namespace, MAX_TABLES),
                )
            names = [str(row["table_name"]) for row in rows]
        for name in names:
            metadata = await self._run(functools.partial(self._metadata, name))
            if metadata is not None:
                await self._apply(name, metadata, None)

    async def scan(
        self,
        table: str,
        row_filter: str | None = None,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
        snapshot_id: int | None = None,
    ) -> dict[str, Any]:
        """``{"snapshot_id", "rows"}``: the rows of ``table`` (as dicts; JSON columns
        decoded) matching ``row_filter`` (Iceberg's expression text, e.g.
        ``"block_number >= 10 and chain_id = 1"``), with only ``columns`` when given,
        at most ``limit``, as of ``snapshot_id`` (default: the newest; 0 or None in
        the answer: the table has no snapshot yet). TooManyRows when more than
        ``max_rows`` rows would answer: narrow the filter, or set a limit."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise SinkRejected(f"limit {limit!r} is no integer")
        if limit is not None and not 0 <= limit <= self.max_rows:
            raise TooManyRows(
                f"limit {limit} is above the lake's {self.max_rows} rows per read "
                "(ICEBERG_MAX_ROWS): read it in parts (a narrower row_filter)"
            )
        if columns is not None and (
            isinstance(columns, str) or not all(isinstance(c, str) for c in columns)
        ):
            raise SinkRejected(f"columns {columns!r} is no list of column names")
        if row_filter is not None and not isinstance(row_filter, str):
            raise SinkRejected(f"row_filter {row_filter!r} is no filter expression text")
        if snapshot_id is not None and (
            isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int)
        ):
            raise SinkRejected(f"snapshot_id {snapshot_id!r} is no snapshot id")
        work = functools.partial(self._scan, table, row_filter, columns, limit, snapshot_id)
        return await self._run(work)

    async def column_types(self, table: str) -> dict[str, SinkType]:
        """The sink type of each column of ``table`` (empty: no such table)."""
        metadata = await self._run(functools.partial(self._metadata, table))
        return {} if metadata is None else sink_types(metadata.schema())

    # Catalog work, on the store's threads.

    def _load(self, table: str) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self._identifier(table))
        except NoSuchTableError:
            return None

    def _metadata(self, table: str) -> TableMetadata | None:
        loaded = self._load(table)
        return None if loaded is None else loaded.metadata

    def _write(
        self,
        table: str,
        declared: Mapping[str, SinkType],
        rows: list[Mapping[str, Any]],
        brought: Mapping[str, Any],
        stamps: Stamps,
        key: Sequence[str] | None,
        change: _Change,
        marker: int,
    ) -> TableMetadata:
        """One attempt at the write's commit; the table's metadata after it."""
        loaded = self._load(table)
        known = {} if loaded is None else sink_types(loaded.schema())
        needed = plan(table, known, declared, brought, max_columns=MAX_COLUMNS)
        for name, old, new in needed.widened:
            raise SinkRejected(
                f"column {name!r} of lake table {table!r} is {old}, and an Iceberg column's "
                f"type cannot become {new}: declare it {new} before the table's first "
                "write (in a new table, or once this one is dropped)"
            )
        names = [n for n in needed.types if n in brought or n in stamps.names]
        kinds = [needed.types[n] for n in names]
        stamped = stamps.columns(0, len(rows))
        raw = [stamped[n] if n in stamped else [row.get(n) for row in rows] for n in names]
        by_name = dict(zip(names, raw, strict=True))
        for name in key or ():
            if name not in needed.types:
                raise SinkRejected(f"key column {name!r} of table {table!r} is in no row")
            if name not in by_name or any(value is None for value in by_name[name]):
                raise SinkRejected(f"a row of table {table!r} has no key column {name!r}")
        values = dict(zip(names, encoded(table, names, kinds, raw), strict=True))
        scales = {} if loaded is None else _scales(loaded)
        for name in names:
            if needed.types[name] is SinkType.NUMERIC:
                scale = scales.setdefault(name, scale_of(values[name]))
                values[name] = decimals(table, name, values[name], scale)
        if loaded is None:
            loaded = self._create(table, needed.types, scales)
            added: list[tuple[str, SinkType]] = []
        else:
            added = needed.added
        with loaded.transaction() as tx:
            if added:
                with tx.update_schema() as update:
                    for name, kind in added:
                        update.add_column(
                            name, iceberg_type(kind, scales.get(name, 0)), doc=doc(kind)
                        )
            frame = arrow_table(tx.table_metadata.schema().as_arrow(), values, len(rows))
            where = _blocks_filter(change.chain_id, [n for n, _ in change.blocks])
            if frame.num_rows:
                # An overwrite: the delete's snapshot (if any) names the write only,
                # the append's carries the change (each summary stays in the metadata).
                tx.delete(where, snapshot_properties={_PREFIX + "write": change.write})
                tx.append(frame, snapshot_properties=change.properties())
            else:
                tx.delete(where, snapshot_properties=change.properties())
            _expire(tx, marker)
        return loaded.metadata

    def _delete(self, table: str, change: _Change, marker: int) -> TableMetadata | None:
        loaded = self._load(table)
        if loaded is None:
            return None
        with loaded.transaction() as tx:
            where = _blocks_filter(change.chain_id, change.deleted)
            tx.delete(where, snapshot_properties=change.properties())
            _expire(tx, marker)
        return loaded.metadata

    def _create(
        self, table: str, types: Mapping[str, SinkType], scales: Mapping[str, int]
    ) -> Table:
        from pyiceberg.exceptions import TableAlreadyExistsError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.transforms import IdentityTransform, TruncateTransform
        from pyiceberg.types import NestedField

        fields = [
            NestedField(
                field_id=i,
                name=name,
                field_type=iceberg_type(kind, scales.get(name, 0)),
                required=False,
                doc=doc(kind),
            )
            for i, (name, kind) in enumerate(types.items(), start=1)
        ]
        ids = {field.name: field.field_id for field in fields}
        spec = PartitionSpec(
            PartitionField(
                source_id=ids[CHAIN_ID], field_id=1000, transform=IdentityTransform(), name="chain"
            ),
            PartitionField(
                source_id=ids[BLOCK_NUMBER],
                field_id=1001,
                transform=TruncateTransform(PARTITION_BLOCKS),
                name="block_range",
            ),
        )
        try:
            return self.catalog.create_table(
                self._identifier(table),
                schema=Schema(*fields),
                partition_spec=spec,
                properties=TABLE_PROPERTIES,
            )
        except TableAlreadyExistsError:
            # Another writer made it first: this attempt starts again from its state.
            raise _Conflict from None

    def _scan(
        self,
        table: str,
        row_filter: str | None,
        columns: Sequence[str] | None,
        limit: int | None,
        snapshot_id: int | None,
    ) -> dict[str, Any]:
        from pyiceberg.expressions import AlwaysTrue

        loaded = self._load(table)
        if loaded is None:
            raise SinkRejected(f"{self.description} has no table {table!r}")
        snapshot = (
            loaded.current_snapshot() if snapshot_id is None else loaded.snapshot_by_id(snapshot_id)
        )
        if snapshot is None:
            if snapshot_id is not None:
                raise SinkRejected(
                    f"table {table!r} has no snapshot {snapshot_id} (expired, or never one of "
                    "its snapshots): read without a snapshot id for the newest"
                )
            return {"snapshot_id": None, "rows": []}
        types = sink_types(loaded.schema())
        if columns is not None:
            unknown = [c for c in columns if c not in types]
            if unknown:
                raise SinkRejected(
                    f"table {table!r} has no column {unknown[0]!r} (it has {', '.join(types)})"
                )
        cap = self.max_rows if limit is None else limit
        where = AlwaysTrue() if not row_filter else _parsed(row_filter)
        try:
            found = loaded.scan(
                row_filter=where,
                selected_fields=tuple(columns) if columns else ("*",),
                snapshot_id=snapshot.snapshot_id,
                limit=cap + 1 if limit is None else cap,
            ).to_arrow()
        except (ValueError, TypeError) as exc:
            raise SinkRejected(f"row_filter {row_filter!r}: {exc}") from None
        if found.num_rows > cap:
            raise TooManyRows(
                f"table {table!r} has more than {cap} rows matching {row_filter or 'no filter'!r}"
                f", the most one read answers (ICEBERG_MAX_ROWS): narrow the row_filter "
                "(a block range), or set a limit"
            )
        rows = found.to_pylist()
        for name in (n for n in found.column_names if types.get(n) is SinkType.JSON):
            for row in rows:
                if row[name] is not None:
                    row[name] = msgspec.json.decode(row[name])
        return {"snapshot_id": snapshot.snapshot_id, "rows": rows}

    # The ledger, in its SQL database.

    async def _same_sink(self, expected: str) -> None:
        actual = await self.ledger.identity()
        if actual != expected:
            raise SinkMismatch(
                f"{self.description} is the sink with identity {actual}, but the task was "
                f"given the sink with identity {expected}: this Worker writes another lake "
                "than the one its driver was given (compare the Workers' ICEBERG_CATALOG_URI "
                "or ICEBERG_LEDGER_URL with the driver's --sink-db); nothing was written"
            )

    async def _claim(self, claim: int | None) -> None:
        if not await self.ledger.unmarked():
            return
        if claim is None:
            raise SinkRejected(
                f"{self.description}: its ledger database holds rows written before sink rows "
                "carried their chain: run blockx backfill or follow against it once; nothing "
                "was written"
            )
        await self.ledger.mark_chain(claim)

    def _catalog_kind(self) -> str:
        """How ``_blockx_lake`` names the catalog: LEDGER_CATALOG for a SQL catalog
        on the ledger's own database (what a driver's ``--sink-db`` reaches), else
        the catalog's type."""
        config = self.config
        if config.catalog_type != "sql":
            return config.catalog_type
        same = describe(config.ledger()) == describe(parse_blockdb_url(config.uri))
        return LEDGER_CATALOG if same else "sql"

    async def _register(self, table: str) -> int:
        """``table`` recorded as the lake's (SinkRejected when the ledger's database
        has a SQL sink table of that name); the sequence number its ledger is at."""
        if table not in self._registered and await self.ledger.column_types(table):
            raise SinkRejected(
                f"table {table!r} is a SQL sink table of {self.ledger.description}, the "
                "lake's ledger database: choose another table name"
            )
        async with self.ledger.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT applied_sequence FROM {LAKE_TABLE} WHERE table_name = ?", (table,)
            )
            if not rows:
                await tx.execute(
                    f"INSERT INTO {LAKE_TABLE} (table_name, namespace, catalog, applied_sequence) "
                    "VALUES (?, ?, ?, 0)",
                    (table, self.namespace, self._catalog_kind()),
                )
        self._registered.add(table)
        return int(rows[0]["applied_sequence"]) if rows else 0

    async def _apply(
        self,
        table: str,
        metadata: TableMetadata | None,
        own: _Change | None,
        code: sink_code.TaskCode | None = None,
    ) -> int:
        """In one ledger transaction: every snapshot of ``metadata`` newer than the
        last applied, applied in order; ``own`` (this store's change) applied too
        when no snapshot records it (it changed no rows); ``code``, its task's
        code, recorded, and the code of tasks no entry names any more removed.
        The newest snapshot's id."""
        if metadata is None:
            changes: list[tuple[int, _Change]] = []
            target = 0
        else:
            target = max((s.sequence_number or 0 for s in metadata.snapshots), default=0)
            changes = []
            for snapshot in metadata.snapshots:
                summary = snapshot.summary
                change = None if summary is None else _Change.of(summary.additional_properties)
                if change is not None and snapshot.sequence_number is not None:
                    changes.append((snapshot.sequence_number, change))
            changes.sort(key=lambda pair: pair[0])
        recorded = own is not None and any(c.write == own.write for _, c in changes)
        async with self.ledger.transaction() as tx:
            await tx.lock([f"{table}:lake"])
            rows = await tx.fetch(
                f"SELECT applied_sequence FROM {LAKE_TABLE} WHERE table_name = ?", (table,)
            )
            marker = int(rows[0]["applied_sequence"]) if rows else 0
            replaced: set[str] = set()
            for sequence, change in changes:
                if marker < sequence <= target:
                    replaced |= await change.apply(tx, table)
            if own is not None and not recorded:
                replaced |= await own.apply(tx, table)
            if code is not None or replaced:
                now_ms = own.written_at_ms if own is not None else 0
                await sink_code.blocks_written(tx, code, table, now_ms, self._code_known, replaced)
            if rows and target > marker:
                await tx.execute(
                    f"UPDATE {LAKE_TABLE} SET applied_sequence = ? WHERE table_name = ?",
                    (target, table),
                )
        if metadata is None or metadata.current_snapshot_id is None:
            return 0
        return metadata.current_snapshot_id

    async def _commit(self, table: str, work: Callable[[], T]) -> T:
        """``work()`` (one commit) on the store's threads, after this store's other
        commits of ``table``, made again while it loses the race with another
        store's commit."""
        async with self._turns.setdefault(table, asyncio.Lock()):
            return await self._commit_racing(table, work)

    async def _commit_racing(self, table: str, work: Callable[[], T]) -> T:
        from pyiceberg.exceptions import CommitFailedException

        attempt = 1
        while True:
            try:
                return await self._run(work)
            except (CommitFailedException, _Conflict) as exc:
                said = str(exc) or "another writer committed first"
            except SinkError:
                raise
            except Exception as exc:
                if not _busy(exc):
                    raise SinkUnavailable(
                        f"{self.description}: writing table {table!r}: {type(exc).__name__}: "
                        f"{str(exc)[:300]}"
                    ) from None
                said = str(exc)[:300]
            if attempt >= COMMIT_ATTEMPTS:
                raise SinkUnavailable(
                    f"{self.description}: table {table!r}: {attempt} commits lost the race "
                    f"with other writers ({said}); retry"
                )
            await asyncio.sleep(COMMIT_BACKOFF.delay(attempt, random.random()))
            attempt += 1


async def lake_of(url: BlockDbUrl, table: str) -> LakeStore | None:
    """The lake whose SQL catalog (and ledger) is the database ``url``, when
    ``table`` is one of its Iceberg tables: what a driver's ``--sink-db`` names; its
    tables' ledgers brought up to date. None for a SQL sink table (or one no
    writer made yet); SinkRejected for a table of a catalog elsewhere (a REST
    catalog, say), which a driver cannot reach from the ledger's database."""
    ledger = await open_sink(url, read_only=True)
    try:
        async with ledger.transaction() as tx:
            if await tx.taken(LAKE_TABLE) is None:
                return None
            rows = await tx.fetch(
                f"SELECT namespace, catalog FROM {LAKE_TABLE} WHERE table_name = ?", (table,)
            )
    finally:
        await ledger.close()
    if not rows:
        return None
    if rows[0]["catalog"] != LEDGER_CATALOG:
        raise SinkRejected(
            f"table {table!r} of {describe(url)} is an Iceberg table of a "
            f"{str(rows[0]['catalog'])[:40]} catalog, which a driver does not reach from the "
            "ledger's database: only a SQL catalog on the --sink-db database can have its "
            "abandoned blocks' rows deleted by blockx follow"
        )
    match url:
        case SqliteUrl(path):
            uri = f"sqlite:///{path}"
        case PostgresUrl(dsn=dsn):
            uri = dsn
    return await LakeStore.open(LakeConfig(uri=uri, namespace=str(rows[0]["namespace"])))


class _Conflict(Exception):
    """Another writer changed the table under this attempt (it made it first)."""


def _catalog(properties: dict[str, str], namespace: str | None) -> Catalog:
    """The catalog, and ``namespace`` made in it when given; SinkUnavailable when it
    does not answer."""
    from pyiceberg.catalog import load_catalog

    try:
        catalog = load_catalog(CATALOG_NAME, **properties)
        if namespace is not None:
            catalog.create_namespace_if_not_exists(namespace)
    except Exception as exc:
        raise SinkUnavailable(
            f"the Iceberg catalog ({properties.get('type')}) does not answer: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    return catalog


def _parsed(row_filter: str) -> BooleanExpression:
    """``row_filter`` as an Iceberg expression; SinkRejected saying where it is not one."""
    from pyiceberg.expressions.parser import parse
    from pyparsing import ParseException

    try:
        return parse(row_filter)
    except ParseException as exc:
        raise SinkRejected(
            f"row_filter {row_filter[:200]!r} is no filter expression at character {exc.loc} "
            "(e.g. \"block_number >= 10 and chain_id = 1\", \"token in ('a', 'b')\")"
        ) from None


def _busy(exc: Exception) -> bool:
    """A SQL catalog's database busy (another writer holds it): worth trying again."""
    text = str(exc).lower()
    return "database is locked" in text or "could not serialize" in text


def _chain_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64[1]:
        raise SinkRejected(f"chain id {value!r} is no chain id (an integer from 0 to 2**63-1)")
    return value


def _scales(loaded: Table) -> dict[str, int]:
    from pyiceberg.types import DecimalType

    return {
        f.name: f.field_type.scale
        for f in loaded.schema().fields
        if isinstance(f.field_type, DecimalType)
    }


def _blocks_filter(chain_id: int, numbers: Sequence[int]) -> BooleanExpression:
    """chain_id = ``chain_id`` and block_number in ``numbers``: one range when they
    are consecutive (what a task writes), else the list."""
    from pyiceberg.expressions.parser import parse

    runs = block_runs(numbers)
    if len(runs) == 1:
        low, high = runs[0]
        blocks = f"{BLOCK_NUMBER} >= {low} and {BLOCK_NUMBER} <= {high}"
    else:
        blocks = f"{BLOCK_NUMBER} in ({', '.join(str(n) for n in sorted(set(numbers)))})"
    return parse(f"{CHAIN_ID} = {chain_id} and {blocks}")


def _expire(tx: Transaction, marker: int) -> None:
    """Within ``tx``: beyond twice KEEP_SNAPSHOTS snapshots, the oldest expired down
    to KEEP_SNAPSHOTS, only those the ledger has applied (at or below ``marker``)."""
    from pyiceberg.table.update.snapshot import ExpireSnapshots

    metadata = tx.table_metadata
    snapshots = sorted(metadata.snapshots, key=lambda s: s.sequence_number or 0)
    if len(snapshots) <= 2 * KEEP_SNAPSHOTS:
        return
    old = [
        s.snapshot_id
        for s in snapshots[:-KEEP_SNAPSHOTS]
        if (s.sequence_number or 0) <= marker and s.snapshot_id != metadata.current_snapshot_id
    ]
    if old:
        ExpireSnapshots(tx).by_ids(old).commit()
