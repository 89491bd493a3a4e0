"""The chain Call Builders over a selective block database (made by ``blockx chain
ingest --logs``): blocks without a row below its head hold no matching log and are
skipped; a table it does not hold, and blocks it never scanned, are refused with
one line, not retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from chain_rows import GENESIS, block_hash, make_block

from blockx_chain.schema import BlockRows, LogFilterRecord
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.code_view import CodeSnapshot
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.config import open_router
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import CallList, PluginError
from blockx_server.pipeline.builders.block_bundle import BlockBundleCallConfig
from blockx_server.pipeline.builders.block_table import BlockTableCallConfig
from blockx_server.pipeline.context import TaskContext

# Blocks 10..29 scanned; only the even ones hold a matching log (and a row).
FIRST, HEAD = 10, 29
HELD = range(FIRST, HEAD + 1, 2)


async def build(builder: Any, router: IoRouter, config: Any) -> tuple[CallList, TaskContext]:
    ctx = TaskContext(
        task=TaskInput(task_id="t1", function_call_config=PluginConfig(type="x")),
        deadline_ms=0,
        code=CodeSnapshot(epoch=1, modules={}, functions={}, parse_errors={}),
        io=TaskIoScope(router, "t1"),
    )
    return await builder.build(ctx, config), ctx


def logs_only(number: int) -> BlockRows:
    block = make_block(number)
    return BlockRows(block=block.block, logs=block.logs)


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[IoRouter]:
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/logs.db")
    store = await open_store(url)
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.set_log_filter(LogFilterRecord(from_block=FIRST))
        await w.insert_blocks([logs_only(n) for n in [*HELD, HEAD]])
        await w.set_chain(
            head_number=HEAD, head_hash=block_hash(HEAD), finalized_number=20, epoch=0
        )
    await store.close()
    backend = BlockDbBackend(url, max_rows=100)
    await backend.start()
    yield open_router(None, blockdb=backend)
    await backend.close()


async def test_a_range_scan_skips_the_blocks_without_a_matching_log(router: IoRouter) -> None:
    config = {"function": "f", "table": "logs", "fromBlock": FIRST, "toBlock": HEAD}
    built, ctx = await build(BlockBundleCallConfig(), router, config)
    assert sorted({c.args[0]["block_number"] for c in built.calls}) == [*HELD, HEAD]
    assert ctx.scan.block_hashes == {n: block_hash(n) for n in [*HELD, HEAD]}
    # Above the head: not ingested yet, retried later.
    later = {**config, "toBlock": HEAD + 3}
    with pytest.raises(PluginError, match="is not in the block database yet") as info:
        await build(BlockBundleCallConfig(), router, later)
    assert info.value.retryable


async def test_what_it_does_not_hold_is_refused_for_good(router: IoRouter) -> None:
    config = {"function": "f", "table": "transactions", "fromBlock": FIRST, "toBlock": HEAD}
    with pytest.raises(PluginError, match="it has no transactions") as info:
        await build(BlockBundleCallConfig(), router, config)
    assert not info.value.retryable
    below = {"function": "f", "table": "logs", "fromBlock": 0, "toBlock": HEAD}
    with pytest.raises(PluginError, match=r"holds only logs from block 10 on .* block 0 was"):
        await build(BlockBundleCallConfig(), router, below)
    one = {"function": "f", "table": "logs", "block": FIRST + 1}
    with pytest.raises(PluginError, match="block 11 holds none of the logs") as info:
        await build(BlockTableCallConfig(), router, one)
    assert not info.value.retryable
