"""``io.iceberg``: the lake's Iceberg tables (``ICEBERG_CATALOG_URI``, ``blockx_chain.lake``).

Read: ``scan(table, row_filter=None, columns=None, limit=None, snapshot_id=None)``
answers ``{"snapshot_id", "rows"}``: the table's rows as objects (JSON columns
decoded, NUMERIC as decimal text), filtered by Iceberg's expression text (e.g.
``"block_number >= 10 and chain_id = 1"``), at most ICEBERG_MAX_ROWS of them (a
wider answer is BAD_REQUEST saying to narrow it). Every read of one table in one
task sees one snapshot: the task's first read of a table pins the snapshot it
read (``SnapshotPins``, kept by the task's IO scope), and its later reads of that
table name it, so a task is reproducible. A read naming its snapshot never
changes: it is cached.

Write (a Writer Plugin's scope only, like ``io.sink``): ``replace_blocks`` with
the arguments of ``io.sink.replace_blocks``, answering ``{"blocks", "rows",
"snapshot_id"}`` (``IcebergWriteResultHandler``).

Failures: a missing table or snapshot, a filter or column that is not one, and
rows that do not fit are BAD_REQUEST (not retryable); an unreachable catalog or
ledger database, and commits that kept losing the race with other writers, are
UNAVAILABLE (retryable). The store is opened at start-up when it can be, and
again on the next request when it could not.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from typing import Any, Final

from blockx_chain.lake import LakeConfig, LakeStore, TooManyRows
from blockx_chain.sink import SinkError, SinkRejected
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.arguments import bind_arguments
from blockx_server.io.errors import BackendError, IoOk, IoOutcome, IoReason

log = logging.getLogger(__name__)

ICEBERG: Final = "iceberg"
SCAN: Final = "scan"
REPLACE_BLOCKS: Final = "replace_blocks"
_SCAN_SIGNATURE: Final = (
    "io.iceberg.scan(table, row_filter=None, columns=None, limit=None, snapshot_id=None)"
)
_SCAN_OPTIONAL: Final = ("row_filter", "columns", "limit", "snapshot_id")
_REPLACE: Final = inspect.signature(LakeStore.replace_blocks).replace(
    parameters=list(inspect.signature(LakeStore.replace_blocks).parameters.values())[1:]
)


def _scan_arguments(args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    return bind_arguments(args, kwargs, _SCAN_SIGNATURE, ("table",), _SCAN_OPTIONAL)


class IcebergBackend:
    name = ICEBERG
    read_ops = frozenset({SCAN})
    write_ops = frozenset({REPLACE_BLOCKS})

    def __init__(self, config: LakeConfig, *, read_only: bool = False) -> None:
        self.config = config
        # The Sync Invoker's: scans alone, and nothing made in the lake or its ledger.
        self.read_only = read_only
        self._store: LakeStore | None = None
        self._opening = asyncio.Lock()

    async def start(self) -> None:
        """Open the lake now; a catalog that does not answer is logged and retried on use."""
        try:
            await self._opened()
        except SinkError as exc:
            log.warning("io.iceberg: %s; requests answer UNAVAILABLE until it answers", exc)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def _opened(self) -> LakeStore:
        async with self._opening:
            if self._store is None:
                self._store = await LakeStore.open(self.config, read_only=self.read_only)
                what = "reads" if self.read_only else "reads and writes"
                log.info("io.iceberg %s %s", what, self._store.description)
            return self._store

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if op == SCAN:
            call = _scan_arguments(args, kwargs)  # TypeError: BAD_REQUEST
        elif op == REPLACE_BLOCKS:
            bound = _REPLACE.bind(*args, **kwargs)
        else:
            raise BackendError(IoErrorKind.UNKNOWN_OP, op)
        try:
            store = await self._opened()
            if op == SCAN:
                return await store.scan(*call)
            return await store.replace_blocks(*bound.args, **bound.kwargs)
        except TooManyRows as exc:
            raise BackendError(
                IoErrorKind.BAD_REQUEST, f"io.iceberg.{op}: {exc}", reason=IoReason.TOO_MANY_ROWS
            ) from None
        except SinkRejected as exc:
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.iceberg.{op}: {exc}") from None
        except SinkError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.iceberg.{op}: {exc}") from None

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """A scan naming its snapshot: a snapshot never changes."""
        return op == SCAN and _scan_arguments(args, kwargs)[4] is not None


class SnapshotPin:
    """One request's arguments, with the snapshot its task pinned for the table;
    ``learn`` gives the answer of the task's first read of the table."""

    def __init__(
        self,
        args: list[Any],
        kwargs: dict[str, Any],
        pins: SnapshotPins | None = None,
        table: str = "",
        first: asyncio.Future[int | None] | None = None,
    ) -> None:
        self.args = args
        self.kwargs = kwargs
        self._pins = pins
        self._table = table
        self._first = first

    def learn(self, outcome: IoOutcome | None) -> None:
        """The first read's answer (None: it never came) sets the table's pin; a
        failed first read, or one of a table with no snapshot yet, pins nothing."""
        if self._first is None or self._pins is None or self._first.done():
            return
        snapshot: int | None = None
        if isinstance(outcome, IoOk):
            value = outcome.value if outcome.value is not None else outcome.decoded()
            if isinstance(value, Mapping) and isinstance(value.get("snapshot_id"), int):
                snapshot = value["snapshot_id"]
        if snapshot is None:
            self._pins.forget(self._table, self._first)
        self._first.set_result(snapshot)


class SnapshotPins:
    """The snapshot of each Iceberg table a task read first (one per task: its
    scopes share it). ``pin`` gives a request its arguments: a scan of a table the
    task read already names that read's snapshot; the first scan of a table is
    sent as asked, and the others wait for its answer."""

    def __init__(self) -> None:
        self._pins: dict[str, asyncio.Future[int | None]] = {}

    async def pin(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any]
    ) -> SnapshotPin:
        if (backend, op) != (ICEBERG, SCAN):
            return SnapshotPin(args, kwargs)
        try:
            table, row_filter, columns, limit, snapshot_id = _scan_arguments(args, kwargs)
        except TypeError:
            return SnapshotPin(args, kwargs)  # the backend says what is wrong
        if snapshot_id is not None or not isinstance(table, str):
            return SnapshotPin(args, kwargs)
        while True:
            pinned = self._pins.get(table)
            if pinned is None:
                first: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
                self._pins[table] = first
                return SnapshotPin(args, kwargs, self, table, first)
            snapshot = await asyncio.shield(pinned)
            if snapshot is not None:
                named = [table, row_filter, columns, limit, snapshot]
                return SnapshotPin(named, {})
            # The first read pinned nothing: this one may be the first now.

    def forget(self, table: str, first: asyncio.Future[int | None]) -> None:
        if self._pins.get(table) is first:
            del self._pins[table]
