"""``BlockBundleWriteResultHandler`` (``BlockTableWriteHandler`` on the bundle
cluster): the block writer's replacement, one transaction per bundle of blocks.

``{"table", "key"?, "columns"?, "bundleSize"?, "sinkIdentity"?, "chainId"?}``
(bundleSize default 100, the same default as BlockBundleCallConfig's; the task's
chain, sinkIdentity and chainId as for ``BlockWriteResultHandler``). The blocks
the task covered (the blocks of its outputs) are cut into bundles of
``bundleSize`` consecutive block numbers counted from the first covered block;
each bundle is checked canonical and written in its own ``io.sink.replace_blocks``
transaction, in block order. A failure stops at its bundle: the bundles before it
stay written (re-running the task rewrites them to the same rows), nothing of it
or after it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import RootOutput
from blockx_server.pipeline.context import DEFAULT_BUNDLE_SIZE, TaskContext
from blockx_server.pipeline.plugins import PluginError
from blockx_server.pipeline.writers.block_write import (
    BlockRows,
    BlockWriteConfig,
    off_loop,
    parse_config,
    replace_blocks,
    rows_per_block,
    task_chain,
)


class BlockBundleWriteConfig(BlockWriteConfig, frozen=True):
    """The block writer's config, and the bundle size."""

    # Unset: the BlockBundleCallConfig's bundleSize, else DEFAULT_BUNDLE_SIZE.
    bundle_size: int | None = None


def bundles(blocks: list[BlockRows], size: int) -> list[list[BlockRows]]:
    """``blocks`` (in block order) cut at every ``size`` block numbers from the first."""
    cut: dict[int, list[BlockRows]] = {}
    first = blocks[0][0] if blocks else 0
    for block in blocks:
        cut.setdefault((block[0] - first) // size, []).append(block)
    return [cut[k] for k in sorted(cut)]


class BlockBundleWriteResultHandler:
    """Result ``{"table", "bundles", "blocks", "rows"}``."""

    name = "BlockBundleWriteResultHandler"

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        parsed: BlockBundleWriteConfig = parse_config(config, BlockBundleWriteConfig, self.name)
        task_chain(ctx, self.name, parsed.chain_id)
        size = parsed.bundle_size or ctx.scan.bundle_size or DEFAULT_BUNDLE_SIZE
        if size < 1:
            raise PluginError.of(f"{self.name} config: bundleSize must be >= 1", retryable=False)
        done = {"bundles": 0, "blocks": 0, "rows": 0}
        covered = await off_loop(
            outputs, lambda: rows_per_block(outputs, self.name, ctx.scan.block_hashes)
        )
        if not covered and parsed.sink_identity is not None:
            # Nothing to write: the sink is still checked to be the one meant.
            await replace_blocks(ctx, self.name, parsed, [])
        for bundle in bundles(covered, size):
            written = await replace_blocks(ctx, self.name, parsed, bundle)
            done["bundles"] += 1
            done["blocks"] += written["blocks"]
            done["rows"] += written["rows"]
        return msgspec.json.encode({"table": parsed.table, **done})
