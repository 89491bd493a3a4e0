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

Streamed (STREAM_BUILD_ENABLED, a streaming Builder), the Worker commits each
bundle as soon as its calls have all converged, during the Calls phase
(``BundleCommitter``), and drops its outputs: a task holds one call window and the
bundle being filled, however long its range. This departs from the
specification's order, where the Writer runs after the Calls converge; each bundle
is still one ``replace_blocks`` transaction after the same canonical check, so
the ledger, per-block locks and reorg checks hold per bundle. The Writer phase
writes the bundles left and reports all of them. A task that fails after some
bundles were committed (CALL_FAILED, a failed read, a failed bundle) reports them
in its plugin result: ``{"table", "committed": [[first, last, blocks, rows], ...]}``
(not a success); the ledger holds their blocks, so ``blockx backfill`` re-plans
only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final

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


def bundle_size(ctx: TaskContext, parsed: BlockBundleWriteConfig, plugin: str) -> int:
    size = parsed.bundle_size or ctx.scan.bundle_size or DEFAULT_BUNDLE_SIZE
    if size < 1:
        raise PluginError.of(f"{plugin} config: bundleSize must be >= 1", retryable=False)
    return size


NAME: Final = "BlockBundleWriteResultHandler"


class BundleCommitter:
    """Commits the finished bundles of a streamed task during its Calls phase.

    ``added(n)`` after the feeder added ``n`` root calls (their blocks' hashes are
    in ``ctx.scan.block_hashes`` by then); ``commit(outputs)`` with the outputs of
    the calls done in a row since the last, in root order. A bundle is finished
    when every block of it was scanned and every call about its blocks is done: the
    Builder's calls come in block order, so once an output is about a later block,
    or every call added is done, the blocks before it hold all their rows.
    ``pending`` are the outputs of the bundles not finished, for the Writer phase.
    """

    def __init__(self, ctx: TaskContext, config: Any) -> None:
        self.ctx = ctx
        self.parsed: BlockBundleWriteConfig = parse_config(config, BlockBundleWriteConfig, NAME)
        task_chain(ctx, NAME, self.parsed.chain_id)
        self.size = bundle_size(ctx, self.parsed, NAME)
        self.first: int | None = None  # the first block of the next bundle
        self.added_calls = 0
        self.taken_calls = 0
        self.scanned_through: int | None = None  # the last block whose calls are added
        self.pending: list[RootOutput] = []

    def added(self, calls: int) -> None:
        hashes = self.ctx.scan.block_hashes
        self.added_calls += calls
        if hashes:
            self.scanned_through = next(reversed(hashes))
            if self.first is None:
                self.first = next(iter(hashes))

    async def commit(self, outputs: Sequence[RootOutput]) -> None:
        self.taken_calls += len(outputs)
        pending = self.pending
        pending.extend(outputs)
        if self.first is None or self.scanned_through is None:
            return
        if self.taken_calls == self.added_calls:
            through = self.scanned_through
        elif pending:
            through = _block_of(pending[-1]) - 1
        else:
            return
        hashes = self.ctx.scan.block_hashes
        while self.first + self.size - 1 <= through:
            end = self.first + self.size
            covered: dict[int, str] = {}
            for n, h in hashes.items():
                if n >= end:
                    break
                covered[n] = h
            cut = 0
            while cut < len(pending) and _block_of(pending[cut]) < end:
                cut += 1
            ready = pending[:cut]
            blocks = await off_loop(ready, partial(rows_per_block, ready, NAME, covered))
            if blocks:
                written = await replace_blocks(self.ctx, NAME, self.parsed, blocks)
                self.ctx.scan.committed.append(
                    [blocks[0][0], blocks[-1][0], written["blocks"], written["rows"]]
                )
                for n in covered:
                    del hashes[n]
            del pending[:cut]
            self.first = end

    def result(self) -> bytes:
        """A failed task's plugin result: the bundles committed."""
        committed = self.ctx.scan.committed
        return msgspec.json.encode({"table": self.parsed.table, "committed": committed})


def _block_of(output: RootOutput) -> int:
    context = output.context
    if context is None or context.block_number is None:
        raise PluginError.of(
            f"{NAME}: call {output.index} is about no block (its call has no block number)",
            retryable=False,
        )
    return context.block_number


class BlockBundleWriteResultHandler:
    """Result ``{"table", "bundles", "blocks", "rows"}``."""

    name = NAME

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        parsed: BlockBundleWriteConfig = parse_config(config, BlockBundleWriteConfig, self.name)
        task_chain(ctx, self.name, parsed.chain_id)
        size = bundle_size(ctx, parsed, self.name)
        committed = ctx.scan.committed  # during the Calls phase, streamed
        done = {
            "bundles": len(committed),
            "blocks": sum(c[2] for c in committed),
            "rows": sum(c[3] for c in committed),
        }
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
