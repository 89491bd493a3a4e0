"""``BlockBundleCallConfig``: the calls of a block range, from a table of the block database.

``{"function", "table", "fromBlock", "toBlock", "bundleSize"?, "where"?, "unit"?}``:
the whole range ``[fromBlock, toBlock]`` is read here, in chunks that fit
BLOCKDB_MAX_ROWS, before any call runs. ``bundleSize`` (blocks per writer
transaction, default 100) goes to the Writer Plugin in ``ctx.scan.bundle_size``.
Any block of the range not yet ingested fails BUILDER_FAILED, retryable.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from blockx_server.pipeline.builders.base import BuilderError, CallList, decode_config
from blockx_server.pipeline.builders.chain_scan import (
    BlockNumber,
    ChainScanner,
    Unit,
    calls_of,
    check_table,
    check_where,
    hashes_of,
)
from blockx_server.pipeline.context import TaskContext

NAME = "BlockBundleCallConfig"
DEFAULT_BUNDLE_SIZE: Final = 100
MAX_BUNDLE_SIZE: Final = 100_000
_SHAPE = (
    '{"function": "<name>", "table": "blocks|transactions|logs|erc20_transfers", '
    '"fromBlock": <number>, "toBlock": <number>, "bundleSize"?: <blocks>, '
    '"where"?: {"<column>": <value>}, "unit"?: "row"|"block"}'
)


class _BlockBundleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    table: str
    from_block: BlockNumber
    to_block: BlockNumber
    bundle_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_BUNDLE_SIZE)] = DEFAULT_BUNDLE_SIZE
    where: dict[str, Any] = msgspec.field(default_factory=dict)
    unit: Unit = Unit.ROW


class BlockBundleCallConfig:
    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = decode_config(NAME, config, _BlockBundleConfig, _SHAPE)
        if decl.to_block < decl.from_block:
            raise BuilderError(
                f"{NAME}: toBlock ({decl.to_block}) is below fromBlock ({decl.from_block})"
            )
        check_table(NAME, decl.table)
        check_where(NAME, decl.where)
        scanner = ChainScanner(ctx, NAME, decl.table, decl.where)
        scanned = await scanner.range(decl.from_block, decl.to_block)
        ctx.scan.record(decl.table, hashes_of(scanned), decl.bundle_size)
        return CallList(decl.function, calls_of(scanned, decl.unit))
