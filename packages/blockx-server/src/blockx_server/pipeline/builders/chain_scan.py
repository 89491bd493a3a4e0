"""Reading the block database for the chain Builders (BlockTable, BlockBundle).

Every read goes through the task's IO scope (``io.blockdb``) with retry, so it is
budgeted, traced and retried like any Builder read. The shape of the calls is
shared: ``unit: "row"`` makes one call per row with the row as its argument,
``unit: "block"`` one call per block with ``{"block": <block row>, "rows": [...]}``,
``unit: "event"`` (the ``logs`` table, with ``"abi"`` and ``"event"``) one call per
log that decodes as that event of that registered ABI, with ``{"block", "log",
"event"}`` (``event`` as ``io.logicalTypes.decode_log`` gives it). The Worker decodes
(``io.logicalTypes``), so the function gets typed arguments. Each call's context
carries its block number and hash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Final, assert_never

import msgspec

from blockx_chain.store.reads import ROW_TABLES
from blockx_core.call_unit import EVENT_TABLE, CallUnit
from blockx_core.calls import CallContext, RootCall
from blockx_server.io.errors import IoFailed, IoOk, IoReason
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError, answer_of

# Blocks read per request at first; halved while an answer would exceed BLOCKDB_MAX_ROWS.
FIRST_CHUNK_BLOCKS: Final = 1000
# A scan sized by rows (a streaming one) starts this small and adapts.
FIRST_SIZED_CHUNK_BLOCKS: Final = 8


BlockNumber = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# A scanned block: its row and its matching rows of the table.
Scanned = tuple[dict[str, Any], list[dict[str, Any]]]


class EventSelection(msgspec.Struct, frozen=True, kw_only=True):
    """The registered event a ``unit: "event"`` scan calls its function for."""

    abi: str
    event: str
    topic0s: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    anonymous: bool = False


def check_unit(
    builder: str, table: str, unit: CallUnit, abi: str | None, event: str | None
) -> None:
    """PluginError unless ``abi`` and ``event`` come with ``unit: "event"`` over logs."""
    if unit is CallUnit.EVENT:
        if table != EVENT_TABLE:
            raise PluginError.of(
                f'{builder}: `unit: "event"` reads the logs table, not {table!r}', retryable=False
            )
        if not abi or not event:
            raise PluginError.of(
                f'{builder}: `unit: "event"` needs `abi` (a registered ABI\'s name, see '
                "`blockx chain abi list`) and `event` (an event's name in it)",
                retryable=False,
            )
    elif abi is not None or event is not None:
        raise PluginError.of(
            f'{builder}: `abi` and `event` go with `unit: "event"`', retryable=False
        )


async def select_event(
    ctx: TaskContext, builder: str, abi: str, event: str, where: dict[str, Any]
) -> tuple[EventSelection, dict[str, Any]]:
    """The registered event (PluginError, not retryable, naming the registered ABIs
    or the ABI's events when there is none) and the ``where`` that reads only the
    logs that can be it: its topic0 and, for an ABI of one contract, its address."""
    what = f"{builder}: looking up event {event!r} of ABI {abi!r}"
    outcome = await ctx.io.request("logicalTypes", "event", [abi, event], {}, retry=True)
    found = answer_of(outcome, what).decoded()
    selection = EventSelection(
        abi=abi,
        event=event,
        topic0s=tuple(found["topic0"]),
        addresses=tuple(found["addresses"]),
        anonymous=bool(found["anonymous"]),
    )
    narrowed = dict(where)
    if len(selection.topic0s) == 1 and not selection.anonymous:
        narrowed.setdefault("topic0", selection.topic0s[0])
    if len(selection.addresses) == 1:
        narrowed.setdefault("address", selection.addresses[0])
    return selection, narrowed


async def decode_events(
    ctx: TaskContext, builder: str, scanned: list[Scanned], selection: EventSelection
) -> list[Scanned]:
    """``scanned`` with each block's rows replaced by ``{"log", "event"}`` of the logs
    that decode as the selected event (the others dropped)."""
    logs = [row for _, rows in scanned for row in rows]
    if not logs:
        return [(block, []) for block, _ in scanned]
    what = f"{builder}: decoding {len(logs)} logs as {selection.abi}.{selection.event}"
    outcome = await ctx.io.request(
        "logicalTypes",
        "decode_logs",
        [logs],
        {"abi": selection.abi, "event": selection.event},
        retry=True,
    )
    events = iter(answer_of(outcome, what).decoded())
    return [
        (
            block,
            [{"log": row, "event": event} for row in rows if (event := next(events)) is not None],
        )
        for block, rows in scanned
    ]


def check_table(builder: str, table: str) -> None:
    if table not in ROW_TABLES:
        raise PluginError.of(
            f"{builder}: `table` must be one of {', '.join(ROW_TABLES)}, got {table!r}",
            retryable=False,
        )


def check_where(builder: str, where: dict[str, Any]) -> None:
    for column, value in where.items():
        if isinstance(value, dict | list):
            raise PluginError.of(
                f"{builder}: `where` compares columns with single values; {column!r} has {value!r}",
                retryable=False,
            )


class _TooWide(PluginError):
    """The answer would exceed BLOCKDB_MAX_ROWS: read fewer blocks at a time."""


async def _read(ctx: TaskContext, op: str, what: str, *args: Any, cache: bool = True) -> Any:
    # A read that skips the cache is this scan's alone: its answer is used as the
    # value the backend returned, never encoded as JSON.
    outcome = await ctx.io.request(
        "blockdb", op, list(args), {}, retry=True, cache=cache, as_json=cache
    )
    match outcome:
        case IoOk():
            return outcome.decoded()
        case IoFailed(reason=IoReason.TOO_MANY_ROWS):
            raise _TooWide.from_io(outcome, what)
        case IoFailed():
            # A refused argument (a column the table lacks, a value the column cannot
            # hold) is the config's fault: BAD_REQUEST is not retryable.
            raise PluginError.from_io(outcome, what)
        case _:
            assert_never(outcome)


class ChainScanner:
    """Reads ``table`` rows matching ``where`` and the block rows of a range, in
    chunks that fit BLOCKDB_MAX_ROWS, checking every row against its block's hash.

    With ``chunk_rows`` (a streamed scan) its reads skip the IO read cache, and each
    chunk aims at about that many rows instead (never
    wider than what fit BLOCKDB_MAX_ROWS): the next chunk's width follows the rows
    per block of the last one."""

    def __init__(
        self,
        ctx: TaskContext,
        builder: str,
        table: str,
        where: dict[str, Any],
        *,
        chunk_rows: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.builder = builder
        self.table = table
        self.where = where
        self.chunk_rows = chunk_rows
        self.chunk = FIRST_CHUNK_BLOCKS if chunk_rows is None else FIRST_SIZED_CHUNK_BLOCKS
        self.widest = FIRST_CHUNK_BLOCKS  # a wider chunk had too many rows
        # What a selective database holds (None: whole blocks), read once.
        self._log_filter: dict[str, Any] | None = None
        self._log_filter_read = False

    async def log_filter(self) -> dict[str, Any] | None:
        """``{"addresses", "topic0s", "from_block"}`` of a selective database (made by
        ``blockx chain ingest --logs``); None for a database of whole blocks."""
        if not self._log_filter_read:
            what = f"{self.builder}: reading what the block database holds"
            found = msgspec.to_builtins(await _read(self.ctx, "log_filter", what))
            self._log_filter = found if isinstance(found, dict) else None
            self._log_filter_read = True
        return self._log_filter

    async def _selective_gaps(self, missing: list[int]) -> bool:
        """Whether ``missing`` blocks are ones a selective database holds no row of
        because they hold no matching log (scanned, at or below its head). A block
        below the first one it scanned was never scanned: that is an error."""
        held = await self.log_filter()
        if held is None:
            return False
        first = int(held.get("from_block", 0))
        if missing[0] < first:
            raise PluginError.of(
                f"{self.builder}: the block database holds only logs from block {first} on "
                f"(a selective ingest, blockx chain ingest --logs): block {missing[0]} was "
                "never scanned",
                retryable=False,
            )
        head = await self.head()
        return head is not None and missing[-1] <= head

    async def block(self, number: int) -> dict[str, Any]:
        """The canonical block row at ``number``; retryable while not yet ingested."""
        row = await _read(self.ctx, "block", f"{self.builder}: reading block {number}", number)
        if row is None:
            if await self._selective_gaps([number]):
                raise PluginError.of(
                    f"{self.builder}: block {number} holds none of the logs the block "
                    "database keeps (a selective ingest stores only the blocks with a "
                    "matching log)",
                    retryable=False,
                )
            raise self.not_ingested(number, await self.head())
        assert isinstance(row, dict)
        return row

    async def head(self) -> int | None:
        """The number of the block database's head; None while nothing is ingested."""
        head = await _read(self.ctx, "head", f"{self.builder}: reading the head")
        return None if head is None else int(head["number"])

    def not_ingested(self, number: int, head: int | None) -> PluginError:
        shown = "nothing is ingested" if head is None else f"the head is {head}"
        return PluginError.of(
            f"{self.builder}: block {number} is not in the block database yet ({shown})",
            retryable=True,
        )

    async def range(self, start: int, end: int) -> list[Scanned]:
        """``(block row, matching rows)`` for every block of ``[start, end]``."""
        return [scanned async for chunk in self.chunks(start, end) for scanned in chunk]

    async def chunks(self, start: int, end: int) -> AsyncIterator[list[Scanned]]:
        """``range`` one chunk at a time, in block order: each chunk is one read of
        the blocks and one of the rows, at most BLOCKDB_MAX_ROWS rows."""
        at = start
        while at <= end:
            last = min(end, at + self.chunk - 1)
            try:
                chunk = await self._chunk(at, last)
            except _TooWide:
                if last == at:
                    raise
                self.chunk = self.widest = max(1, (last - at + 1) // 2)
                continue
            if self.chunk_rows is not None:
                self._aim(last - at + 1, sum(len(rows) for _, rows in chunk))
            at = last + 1
            yield chunk

    def _aim(self, blocks: int, rows: int) -> None:
        assert self.chunk_rows is not None
        wanted = blocks * self.chunk_rows // rows if rows else blocks * 2
        self.chunk = max(1, min(self.widest, wanted))

    async def _chunk(self, start: int, end: int) -> list[Scanned]:
        what = f"{self.builder}: reading blocks {start}..{end}"
        # A sized (streamed) scan reads each chunk once: its reads skip the read
        # cache, which would otherwise grow with the range.
        cache = self.chunk_rows is None
        blocks: list[dict[str, Any]] = await _read(
            self.ctx, "blocks", what, start, end, cache=cache
        )
        have = {b["block_number"] for b in blocks}
        missing = [n for n in range(start, end + 1) if n not in have]
        if missing and not await self._selective_gaps(missing):
            raise PluginError.of(
                f"{self.builder}: block {missing[0]} is not in the block database yet "
                f"({len(missing)} of blocks {start}..{end} missing)",
                retryable=True,
            )
        what = f"{self.builder}: reading {self.table} of blocks {start}..{end}"
        rows: list[dict[str, Any]] = await _read(
            self.ctx, "rows", what, self.table, start, end, self.where, cache=cache
        )
        by_block: dict[int, list[dict[str, Any]]] = {b["block_number"]: [] for b in blocks}
        hashes = {b["block_number"]: b["block_hash"] for b in blocks}
        for row in rows:
            number = row["block_number"]
            if row["block_hash"] != hashes[number]:
                # A reorg replaced the block between the two reads: read again later.
                raise PluginError.of(
                    f"{self.builder}: block {number} changed while it was read "
                    f"(a reorg); try again",
                    retryable=True,
                )
            by_block[number].append(row)
        return [(b, by_block[b["block_number"]]) for b in blocks]


def calls_of(scanned: list[Scanned], unit: CallUnit) -> list[RootCall]:
    calls: list[RootCall] = []
    for block, rows in scanned:
        context = CallContext(block_number=block["block_number"], block_hash=block["block_hash"])
        match unit:
            case CallUnit.ROW:
                calls.extend(RootCall([row], context=context) for row in rows)
            case CallUnit.BLOCK:
                calls.append(RootCall([{"block": block, "rows": rows}], context=context))
            case CallUnit.EVENT:
                calls.extend(
                    RootCall(
                        [{"block": block, "log": item["log"], "event": item["event"]}],
                        context=context,
                    )
                    for item in rows
                )
            case _:
                assert_never(unit)
    return calls


def hashes_of(scanned: list[Scanned]) -> dict[int, str]:
    return {block["block_number"]: block["block_hash"] for block, _ in scanned}
