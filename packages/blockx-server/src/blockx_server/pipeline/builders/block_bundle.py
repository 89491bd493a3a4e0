"""``BlockBundleCallConfig``: the calls of a block range, from a table of the block database.

``{"function", "table", "fromBlock", "toBlock", "bundleSize"?, "where"?, "unit"?,
"abi"?, "event"?}`` (``unit: "event"``: see ``chain_scan``):
the range ``[fromBlock, toBlock]`` is read in chunks that fit BLOCKDB_MAX_ROWS.
``build`` reads it all before any call runs; with stream build on,
``prepare_stream`` checks the config, that the range is not above the head and that
its first block is ingested, and chunks of about STREAM_CHUNK_ROWS rows are read
during the Calls phase (``streaming.py``). ``bundleSize`` (blocks per writer
transaction, default 100) goes to the Writer Plugin in ``ctx.scan.bundle_size``,
and every scanned block's hash in ``ctx.scan.block_hashes``.
Any block of the range not yet ingested fails BUILDER_FAILED, retryable.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Annotated, Any, Final

import msgspec

from blockx_chain.store.reads import ROW_TABLES
from blockx_core.call_unit import CallUnit
from blockx_core.calls import RootCall
from blockx_server.pipeline.builders.base import CallList, decode_config
from blockx_server.pipeline.builders.chain_scan import (
    BlockNumber,
    ChainScanner,
    EventSelection,
    calls_of,
    check_table,
    check_unit,
    check_where,
    decode_events,
    hashes_of,
    select_event,
)
from blockx_server.pipeline.builders.streaming import CallStream
from blockx_server.pipeline.context import DEFAULT_BUNDLE_SIZE, TaskContext
from blockx_server.pipeline.plugins import PluginError

NAME = "BlockBundleCallConfig"
# Rows per chunk of a streamed scan: a few call windows (TASK_MAX_INFLIGHT_CALLS is
# 1024 by default), so the scan holds little more than what runs.
STREAM_CHUNK_ROWS: Final = 2048
MAX_BUNDLE_SIZE: Final = 100_000
_SHAPE = (
    '{"function": "<name>", "table": "' + "|".join(ROW_TABLES) + '", '
    '"fromBlock": <number>, "toBlock": <number>, "bundleSize"?: <blocks>, '
    '"where"?: {"<column>": <value>}, "unit"?: "row"|"block"|"event", '
    '"abi"?: "<registered ABI>", "event"?: "<event name>", "chain"?: "<name>"}'
)


class _BlockBundleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    table: str
    from_block: BlockNumber
    to_block: BlockNumber
    bundle_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_BUNDLE_SIZE)] = DEFAULT_BUNDLE_SIZE
    where: dict[str, Any] = msgspec.field(default_factory=dict)
    unit: CallUnit = CallUnit.ROW
    abi: str | None = None
    event: str | None = None
    # The chain read (the task's, set at activation: blockx_server.pipeline.task_chain).
    chain: str | None = None


def _decode(config: Any) -> _BlockBundleConfig:
    decl = decode_config(NAME, config, _BlockBundleConfig, _SHAPE)
    if decl.to_block < decl.from_block:
        raise PluginError.of(
            f"{NAME}: toBlock ({decl.to_block}) is below fromBlock ({decl.from_block})",
            retryable=False,
        )
    check_table(NAME, decl.table)
    check_where(NAME, decl.where)
    check_unit(NAME, decl.table, decl.unit, decl.abi, decl.event)
    return decl


async def _selected(
    ctx: TaskContext, decl: _BlockBundleConfig
) -> tuple[EventSelection | None, dict[str, Any]]:
    if decl.abi is None or decl.event is None:
        return None, decl.where
    return await select_event(ctx, NAME, decl.abi, decl.event, decl.where)


class BlockBundleCallConfig:
    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = _decode(config)
        selection, where = await _selected(ctx, decl)
        scanner = ChainScanner(ctx, NAME, decl.table, where)
        scanned = await scanner.range(decl.from_block, decl.to_block)
        ctx.scan.record(decl.table, hashes_of(scanned), decl.bundle_size)
        if selection is not None:
            scanned = await decode_events(ctx, NAME, scanned, selection)
        return CallList(decl.function, calls_of(scanned, decl.unit))

    async def prepare_stream(self, ctx: TaskContext, config: Any) -> CallStream:
        decl = _decode(config)
        selection, where = await _selected(ctx, decl)
        scanner = ChainScanner(ctx, NAME, decl.table, where, chunk_rows=STREAM_CHUNK_ROWS)
        # A range not ingested yet fails here, before any call runs; a block missing
        # inside it is only found when its chunk is read.
        head = await scanner.head()
        if head is None or head < decl.to_block:
            first = decl.from_block if head is None else max(decl.from_block, head + 1)
            raise scanner.not_ingested(first, head)
        await scanner.block(decl.from_block)
        ctx.scan.record(decl.table, {}, decl.bundle_size)
        return _BundleStream(decl, scanner, ctx, selection)


class _BundleStream:
    def __init__(
        self,
        decl: _BlockBundleConfig,
        scanner: ChainScanner,
        ctx: TaskContext,
        selection: EventSelection | None,
    ) -> None:
        self._decl = decl
        self._scanner = scanner
        self._ctx = ctx
        self._scan = ctx.scan
        self._selection = selection

    @property
    def function(self) -> str:
        return self._decl.function

    async def chunks(self) -> AsyncGenerator[Sequence[RootCall]]:
        decl = self._decl
        async for scanned in self._scanner.chunks(decl.from_block, decl.to_block):
            # Per block only: the writer's bundles and reorg check need every hash.
            self._scan.block_hashes.update(hashes_of(scanned))
            if self._selection is not None:
                scanned = await decode_events(self._ctx, NAME, scanned, self._selection)
            yield calls_of(scanned, decl.unit)
