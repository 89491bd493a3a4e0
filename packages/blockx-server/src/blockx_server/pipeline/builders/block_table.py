"""``BlockTableCallConfig``: the calls of one block, from a table of the block database.

``{"function", "table", "block", "where"?, "unit"?, "abi"?, "event"?}``: ``block`` is a number, or
``{"number", "hash"}`` to pin the branch. A pinned hash that is no longer
canonical fails BUILDER_FAILED, not retryable (that block is gone for good); a
block not yet ingested fails BUILDER_FAILED, retryable (ingest will bring it).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from blockx_chain.store.reads import ROW_TABLES
from blockx_core.call_unit import CallUnit
from blockx_server.pipeline.builders.base import CallList, decode_config
from blockx_server.pipeline.builders.chain_scan import (
    BlockNumber,
    ChainScanner,
    calls_of,
    check_table,
    check_unit,
    check_where,
    decode_events,
    hashes_of,
    select_event,
)
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError

NAME = "BlockTableCallConfig"
_SHAPE = (
    '{"function": "<name>", "table": "' + "|".join(ROW_TABLES) + '", '
    '"block": <number> | {"number": <number>, "hash": "0x..."}, '
    '"where"?: {"<column>": <value>}, "unit"?: "row"|"block"|"event", '
    '"abi"?: "<registered ABI>", "event"?: "<event name>", "chain"?: "<name>"}'
)


class BlockPin(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    number: BlockNumber
    hash: Annotated[str, msgspec.Meta(pattern="^0x[0-9a-fA-F]{64}$")]


class _BlockTableConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    function: str
    table: str
    block: BlockNumber | BlockPin
    where: dict[str, Any] = msgspec.field(default_factory=dict)
    unit: CallUnit = CallUnit.ROW
    abi: str | None = None
    event: str | None = None
    # The chain read (the task's, set at activation: blockx_server.pipeline.task_chain).
    chain: str | None = None


class BlockTableCallConfig:
    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = decode_config(NAME, config, _BlockTableConfig, _SHAPE)
        check_table(NAME, decl.table)
        check_where(NAME, decl.where)
        check_unit(NAME, decl.table, decl.unit, decl.abi, decl.event)
        where, selection = decl.where, None
        if decl.abi is not None and decl.event is not None:
            selection, where = await select_event(ctx, NAME, decl.abi, decl.event, where)
        number, pinned = (
            (decl.block.number, decl.block.hash.lower())
            if isinstance(decl.block, BlockPin)
            else (decl.block, None)
        )
        scanner = ChainScanner(ctx, NAME, decl.table, where)
        canonical = await scanner.block(number)
        if pinned is not None and canonical["block_hash"] != pinned:
            raise PluginError.of(
                f"{NAME}: block {number} {pinned} is no longer canonical "
                f"(the chain has {canonical['block_hash']} there)",
                retryable=False,
            )
        scanned = await scanner.range(number, number)
        if scanned[0][0]["block_hash"] != canonical["block_hash"]:
            raise PluginError.of(
                f"{NAME}: block {number} changed while it was read (a reorg); try again",
                retryable=True,
            )
        ctx.scan.record(decl.table, hashes_of(scanned), None)
        if selection is not None:
            scanned = await decode_events(ctx, NAME, scanned, selection)
        return CallList(decl.function, calls_of(scanned, decl.unit))
