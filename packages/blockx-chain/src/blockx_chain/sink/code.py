"""The code that wrote the sink's rows: ``_blockx_code`` and ``_blockx_task_code``.

A Worker numbers its code epochs itself, so a row's ``code_epoch`` alone does
not say which code wrote it. Each write also gives the digest of its task's
module set (``CodeSnapshot.digest``) and the sources (``{module: source}``); in
the write's transaction the sink keeps:

- ``_blockx_code``: ``code_digest`` (the key), ``sources`` (the JSON object of
  module sources) and ``first_written_at_ms``: each module set once, whatever
  the Workers, epochs and tasks that ran it;
- ``_blockx_task_code``: ``task_id`` (the key), ``code_digest``, ``code_epoch``,
  ``table_name``, ``kind`` (``blocks`` for a block write, ``upsert``) and
  ``written_at_ms``: which module set each task ran.

A ledger entry (``_blockx_written``) names its task, so a block's rows lead to
their code: ledger entry → task → module set. A store remembers the digests it
has stored: a write of a known digest stores no sources again (one statement
records its task, and stores them again only if another writer removed them
meanwhile).

Bounded: the sink keeps the tasks some ledger entry still names, and the newest
``UPSERT_TASKS_KEPT`` tasks of upserts (upserted rows name no task); a module
set no kept task names is removed. Removal is part of the writes that make it
due, and cheap: a block write or delete looks at the tasks of the entries it
replaced or removed (the ledger is indexed by task), an upsert at the upsert
tasks beyond the kept ones; only when that removes a task (or a task ran other
code this time) does it look for module sets no task names, a pass over
``_blockx_code``, which holds one row per module set kept. A sink written by a
BlockX that kept no code holds no code for those rows (their entries lead to no
task's code).

On PostgreSQL writers run side by side: a write that records a task's row
holds its module set's row (``FOR KEY SHARE``) until it commits, and a removal
locks the set's row (``FOR UPDATE``, skipping a set a write holds) before it
looks whether a task names it; a set some write is recording is left for a
later removal. Writes that replace entries of one task take turns on a lock of
that task before looking whether any entry still names it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

from blockx_chain.sink.errors import SinkRejected, SinkUnavailable
from blockx_chain.sink.schema import LEDGER

if TYPE_CHECKING:
    from blockx_chain.sink.tx import SinkTx

CODE_TABLE: Final = "_blockx_code"
TASK_CODE_TABLE: Final = "_blockx_task_code"
# Tasks of upserts kept (the newest by write); a block write's task is kept while
# the ledger names it.
UPSERT_TASKS_KEPT: Final = 1000
# The most characters of sources a reader loads from the sink.
MAX_CODE_BYTES: Final = 64 * 1024 * 1024
# Task ids looked up per statement.
_CHUNK: Final = 500
_DIGEST: Final = re.compile(r"[0-9a-f]{16,128}")
_LEDGER_TASK_INDEX_NAME: Final = f"{LEDGER}_by_task"
LEDGER_TASK_INDEX: Final = (
    f"CREATE INDEX IF NOT EXISTS {_LEDGER_TASK_INDEX_NAME} ON {LEDGER} (task_id)"
)


async def make_code_tables(tx: SinkTx) -> None:
    """The tables and their indexes, made with the writers' other tables. An index
    is made only when missing: on PostgreSQL even ``CREATE INDEX IF NOT EXISTS``
    locks its table against writes, which a running writer waits on."""
    big = "BIGINT" if tx.postgres else "INTEGER"
    await tx.execute(
        f"CREATE TABLE IF NOT EXISTS {CODE_TABLE} (code_digest TEXT NOT NULL PRIMARY KEY, "
        f"sources TEXT NOT NULL, first_written_at_ms {big} NOT NULL)"
    )
    await tx.execute(
        f"CREATE TABLE IF NOT EXISTS {TASK_CODE_TABLE} (task_id TEXT NOT NULL PRIMARY KEY, "
        f"code_digest TEXT NOT NULL, code_epoch {big} NOT NULL, table_name TEXT NOT NULL, "
        f"kind TEXT NOT NULL, written_at_ms {big} NOT NULL)"
    )
    indexes = {
        f"{TASK_CODE_TABLE}_by_digest": f"{TASK_CODE_TABLE} (code_digest)",
        f"{TASK_CODE_TABLE}_by_kind": f"{TASK_CODE_TABLE} (kind, written_at_ms)",
        _LEDGER_TASK_INDEX_NAME: f"{LEDGER} (task_id)",
    }
    for name, on in indexes.items():
        if await tx.taken(name) is None:
            await tx.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {on}")


class WriteKind(enum.StrEnum):
    """What a task wrote: blocks (a block writer) or rows by key (an upsert)."""

    BLOCKS = "blocks"
    UPSERT = "upsert"


class TaskCode(msgspec.Struct, frozen=True, kw_only=True):
    """A write's code: the digest of its module set, the sources, the epoch its
    Worker gave them, and the task."""

    digest: str
    sources: Mapping[str, str]
    epoch: int
    task_id: str


class BlockCode(msgspec.Struct, frozen=True, kw_only=True):
    """A block's ledger entry, and the code its task ran (None: the sink kept none
    for it, as for a block written by a BlockX that kept no code)."""

    table: str
    chain_id: int
    block_number: int
    block_hash: str
    code_epoch: int
    task_id: str
    written_at_ms: int
    code: WrittenCode | None


class WrittenCode(msgspec.Struct, frozen=True, kw_only=True):
    """The code of a module set, and which task ran it (None when asked by digest).

    ``table`` and ``kind`` say what the task wrote (``blocks`` or ``upsert``)."""

    code_digest: str
    sources: dict[str, str]
    first_written_at_ms: int
    task_id: str | None = None
    code_epoch: int | None = None
    table: str | None = None
    kind: WriteKind | None = None
    written_at_ms: int | None = None


def checked_code(
    code_digest: Any, code_sources: Any, code_epoch: int, task_id: str
) -> TaskCode | None:
    """A write's code arguments, checked; None when the writer gave none."""
    if code_digest is None and code_sources is None:
        return None
    if not isinstance(code_digest, str) or _DIGEST.fullmatch(code_digest) is None:
        raise SinkRejected(
            f"code_digest {code_digest!r:.80} is no digest (16 to 128 lowercase hex digits)"
        )
    if not isinstance(code_sources, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in code_sources.items()
    ):
        raise SinkRejected("code_sources is no object of module names to source texts")
    if not isinstance(task_id, str) or not task_id:
        raise SinkRejected("a write that records its code names its task (task_id)")
    return TaskCode(digest=code_digest, sources=code_sources, epoch=code_epoch, task_id=task_id)


_STORE_SQL: Final = (
    f"INSERT INTO {CODE_TABLE} (code_digest, sources, first_written_at_ms) VALUES (?, ?, ?) "
    "ON CONFLICT (code_digest) DO NOTHING"
)
_MAP_COLUMNS: Final = "task_id, code_digest, code_epoch, table_name, kind, written_at_ms"
_MAP_CONFLICT: Final = (
    "ON CONFLICT (task_id) DO UPDATE SET code_digest = excluded.code_digest, "
    "code_epoch = excluded.code_epoch, table_name = excluded.table_name, "
    "kind = excluded.kind, written_at_ms = excluded.written_at_ms"
)
# The most times a write stores its module set: each time, a removal committed
# between the store and the task's row can have taken it (then the write is
# retryable).
_STORE_ATTEMPTS: Final = 3


def _map_if_stored(postgres: bool) -> str:
    """The task's row, only when its module set is stored (a row tells which).
    On PostgreSQL the set's row is locked ``FOR KEY SHARE`` until the commit: a
    removal (which locks it ``FOR UPDATE``) waits for the task's row, or skips
    the set, and one under way makes this wait and find the set gone."""
    held = " FOR KEY SHARE" if postgres else ""
    return (
        f"INSERT INTO {TASK_CODE_TABLE} ({_MAP_COLUMNS}) SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS "
        f"(SELECT 1 FROM {CODE_TABLE} WHERE code_digest = ?{held}) {_MAP_CONFLICT} "
        "RETURNING task_id"
    )


_UNUSED_SQL: Final = (
    f"DELETE FROM {CODE_TABLE} WHERE code_digest = ? AND NOT EXISTS "
    f"(SELECT 1 FROM {TASK_CODE_TABLE} WHERE code_digest = ?) RETURNING code_digest"
)
_HOLD_SQL: Final = (
    f"SELECT code_digest FROM {CODE_TABLE} WHERE code_digest = ? FOR UPDATE SKIP LOCKED"
)
_OLD_UPSERTS_SQL: Final = (
    f"DELETE FROM {TASK_CODE_TABLE} WHERE kind = ? AND task_id NOT IN "
    f"(SELECT task_id FROM {TASK_CODE_TABLE} WHERE kind = ? "
    "ORDER BY written_at_ms DESC, task_id LIMIT ?) RETURNING code_digest"
)


def _in(count: int) -> str:
    return ", ".join("?" for _ in range(count))


def _chunks(items: Iterable[str]) -> list[list[str]]:
    listed = sorted(set(items))
    return [listed[i : i + _CHUNK] for i in range(0, len(listed), _CHUNK)]


def _sources_json(code: TaskCode) -> str:
    return msgspec.json.encode(dict(sorted(code.sources.items()))).decode()


async def _previous(tx: SinkTx, task_id: str) -> str | None:
    """The module set ``task_id`` was recorded with before this write."""
    rows = await tx.fetch(
        f"SELECT code_digest FROM {TASK_CODE_TABLE} WHERE task_id = ?", (task_id,)
    )
    return str(rows[0]["code_digest"]) if rows else None


async def _record(
    tx: SinkTx, code: TaskCode, table: str, kind: WriteKind, now_ms: int, known: set[str]
) -> None:
    """Record ``code`` as its task's (``kind`` of write to ``table``), its sources
    stored unless ``known`` says they are already."""
    mapped = (
        _map_if_stored(tx.postgres),
        (code.task_id, code.digest, code.epoch, table, kind, now_ms, code.digest),
    )
    if code.digest in known and await tx.fetch(*mapped):
        return
    for _ in range(_STORE_ATTEMPTS):
        await tx.execute(_STORE_SQL, (code.digest, _sources_json(code), now_ms))
        if await tx.fetch(*mapped):
            # Remembered before the commit: a write rolled back leaves a digest
            # known but not stored, which the next write of it finds out and mends.
            known.add(code.digest)
            return
    raise SinkUnavailable(
        f"the code {code.digest} was removed {_STORE_ATTEMPTS} times while this write "
        "recorded it: try again"
    )


async def blocks_written(
    tx: SinkTx,
    code: TaskCode | None,
    table: str,
    now_ms: int,
    known: set[str],
    replaced: set[str],
) -> None:
    """After a block write's ledger entries: its code recorded (when given), and
    the records of the tasks whose entries it ``replaced`` removed when no entry
    names them any more."""
    changed = False
    if code is not None:
        if code.task_id in replaced:
            changed = await _previous(tx, code.task_id) not in (None, code.digest)
        await _record(tx, code, table, WriteKind.BLOCKS, now_ms, known)
        replaced = replaced - {code.task_id}
    if await _forget_tasks(tx, replaced) or changed:
        await _sweep(tx, known)


async def upserted(
    tx: SinkTx, code: TaskCode | None, table: str, now_ms: int, known: set[str]
) -> None:
    """After an upsert's rows: its code recorded (when given), and the upsert
    tasks beyond the newest UPSERT_TASKS_KEPT removed."""
    if code is None:
        return
    changed = await _previous(tx, code.task_id) not in (None, code.digest)
    await _record(tx, code, table, WriteKind.UPSERT, now_ms, known)
    upserts = WriteKind.UPSERT
    if await tx.fetch(_OLD_UPSERTS_SQL, (upserts, upserts, UPSERT_TASKS_KEPT)) or changed:
        await _sweep(tx, known)


async def blocks_deleted(tx: SinkTx, replaced: set[str], known: set[str]) -> None:
    """After a delete of blocks: the records of the tasks whose entries it removed
    (``replaced``) removed when no entry names them any more."""
    if await _forget_tasks(tx, replaced):
        await _sweep(tx, known)


async def unrecord_runs(tx: SinkTx, table: str, runs: Iterable[tuple[int, int, int]]) -> set[str]:
    """Delete the ledger entries of ``table`` of these runs of blocks (``(chain_id,
    first, last)``); the tasks they named."""
    found: set[str] = set()
    for chain_id, low, high in runs:
        rows = await tx.fetch(
            f"DELETE FROM {LEDGER} WHERE table_name = ? AND chain_id = ? "
            "AND block_number BETWEEN ? AND ? RETURNING task_id",
            (table, chain_id, low, high),
        )
        found.update(str(r["task_id"]) for r in rows)
    return found


async def _forget_tasks(tx: SinkTx, tasks: Iterable[str]) -> bool:
    """Remove the records of these block writes' tasks that no ledger entry names
    any more; whether a module set they named may be unused now."""
    unused = False
    listed = sorted(set(tasks))
    # Two writes that each replace part of one task's entries would each see the
    # other's part still there: they take turns, the second seeing the first's.
    await tx.lock([f"{TASK_CODE_TABLE}:{task}" for task in listed])
    for chunk in _chunks(listed):
        marks = _in(len(chunk))
        rows = await tx.fetch(
            f"DELETE FROM {TASK_CODE_TABLE} WHERE kind = ? AND task_id IN ({marks}) "
            f"AND NOT EXISTS (SELECT 1 FROM {LEDGER} l WHERE l.task_id = "
            f"{TASK_CODE_TABLE}.task_id) RETURNING EXISTS (SELECT 1 FROM {TASK_CODE_TABLE} o "
            f"WHERE o.code_digest = {TASK_CODE_TABLE}.code_digest AND o.task_id NOT IN "
            f"({marks})) AS named",
            (WriteKind.BLOCKS, *chunk, *chunk),
        )
        # A set another task (outside the chunk, whose removals this statement
        # cannot see) still names is not unused.
        unused = unused or any(not row["named"] for row in rows)
    return unused


async def _sweep(tx: SinkTx, known: set[str]) -> None:
    """Remove every module set no task names (one pass over ``_blockx_code``, as
    small as the module sets kept). On PostgreSQL each set's row is locked first,
    skipping one some write holds (it is recording a task's row for it: that
    write names it, or, rolled back, leaves it to the next sweep); the removal
    then looks again, seeing every task's row committed meanwhile."""
    rows = await tx.fetch(
        f"SELECT code_digest FROM {CODE_TABLE} c WHERE NOT EXISTS "
        f"(SELECT 1 FROM {TASK_CODE_TABLE} t WHERE t.code_digest = c.code_digest)",
        (),
    )
    for digest in sorted(str(r["code_digest"]) for r in rows):
        if tx.postgres and not await tx.fetch(_HOLD_SQL, (digest,)):
            continue
        if await tx.fetch(_UNUSED_SQL, (digest, digest)):
            known.discard(digest)


_TASK_COLUMNS: Final = (
    "t.task_id, t.code_digest, t.code_epoch, t.table_name, t.kind, t.written_at_ms"
)


async def read_code(
    tx: SinkTx, digest: str, task: Mapping[str, Any] | None = None
) -> WrittenCode | None:
    """The module set ``digest`` (with its ``task``'s row of ``_blockx_task_code``),
    None when the sink does not hold it; SinkRejected when what it holds is no
    object of sources within MAX_CODE_BYTES."""
    rows = await tx.fetch(
        f"SELECT first_written_at_ms, length(sources) AS size FROM {CODE_TABLE} "
        "WHERE code_digest = ?",
        (digest,),
    )
    if not rows:
        return None
    if int(rows[0]["size"]) > MAX_CODE_BYTES:
        raise SinkRejected(
            f"the sources of code {digest} are {int(rows[0]['size']):,} characters, more "
            f"than a reader loads ({MAX_CODE_BYTES:,})"
        )
    text = await tx.fetch(f"SELECT sources FROM {CODE_TABLE} WHERE code_digest = ?", (digest,))
    try:
        sources = msgspec.json.decode(str(text[0]["sources"]), type=dict[str, str])
    except (msgspec.DecodeError, IndexError) as exc:
        raise SinkRejected(
            f"the sources of code {digest} are no object of module sources: {exc}"
        ) from None
    extra: dict[str, Any] = {}
    if task is not None:
        extra = {
            "task_id": str(task["task_id"]),
            "code_epoch": int(task["code_epoch"]),
            "table": str(task["table_name"]),
            "kind": _kind(digest, task["kind"]),
            "written_at_ms": int(task["written_at_ms"]),
        }
    return WrittenCode(
        code_digest=digest,
        sources=sources,
        first_written_at_ms=int(rows[0]["first_written_at_ms"]),
        **extra,
    )


def _kind(digest: str, raw: Any) -> WriteKind:
    try:
        return WriteKind(raw)
    except ValueError:
        raise SinkRejected(f"a task of code {digest} wrote {raw!r:.40}, no kind of write") from None


async def read_task_code(tx: SinkTx, task_id: str) -> WrittenCode | None:
    """The code ``task_id`` ran, None when the sink kept none for it."""
    rows = await tx.fetch(
        f"SELECT {_TASK_COLUMNS} FROM {TASK_CODE_TABLE} t WHERE t.task_id = ?", (task_id,)
    )
    return await read_code(tx, str(rows[0]["code_digest"]), rows[0]) if rows else None


async def read_block_code(
    tx: SinkTx, table: str, block_number: int, chain_id: int | None, *, coded: bool = True
) -> list[BlockCode]:
    """The ledger entries of ``block_number`` of ``table`` (of ``chain_id``'s only
    when given), by chain id, each with the code its task ran (none when not
    ``coded``: the sink keeps no code)."""
    where = "table_name = ? AND block_number = ?"
    params: tuple[Any, ...] = (table, block_number)
    if chain_id is not None:
        where += " AND chain_id = ?"
        params += (chain_id,)
    entries = await tx.fetch(
        f"SELECT chain_id, block_hash, code_epoch, task_id, written_at_ms FROM {LEDGER} "
        f"WHERE {where} ORDER BY chain_id",
        params,
    )
    found = []
    for entry in entries:
        task_id = str(entry["task_id"])
        found.append(
            BlockCode(
                table=table,
                chain_id=int(entry["chain_id"]),
                block_number=block_number,
                block_hash=str(entry["block_hash"]),
                code_epoch=int(entry["code_epoch"]),
                task_id=task_id,
                written_at_ms=int(entry["written_at_ms"]),
                code=await read_task_code(tx, task_id) if coded else None,
            )
        )
    return found
