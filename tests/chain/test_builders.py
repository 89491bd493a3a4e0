"""The chain Call Builders and InputsCallConfig against a real SQLite block database,
read through TaskIoScope + IoRouter + BlockDbBackend as in a Worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from chain_rows import GENESIS, OTHER_TOPIC, TOKEN, block_hash, make_block

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.calls import CallContext
from blockx_core.code_view import CodeSnapshot
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.config import open_router
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import CallList, PluginError
from blockx_server.pipeline.builders.block_bundle import BlockBundleCallConfig
from blockx_server.pipeline.builders.block_table import BlockTableCallConfig
from blockx_server.pipeline.builders.inputs import MAX_DEPTH, InputsCallConfig
from blockx_server.pipeline.context import TaskContext

# Blocks 0..9 are ingested; 2 transactions, 4 logs and 2 transfers per block.
HEAD = 9
# Small enough that a 10-block range of logs (40 rows) must be read in chunks.
MAX_ROWS = 12


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[IoRouter]:
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    store = await open_store(url)
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(n) for n in range(HEAD + 1)])
        await w.set_chain(head_number=HEAD, head_hash=block_hash(HEAD), finalized_number=5, epoch=1)
    await store.close()
    backend = BlockDbBackend(url, max_rows=MAX_ROWS)
    await backend.start()
    yield open_router(None, blockdb=backend)
    await backend.close()


def context(router: IoRouter) -> TaskContext:
    return TaskContext(
        task=TaskInput(task_id="t1", function_call_config=PluginConfig(type="x")),
        deadline_ms=0,
        code=CodeSnapshot(epoch=1, modules={}, functions={}, parse_errors={}),
        io=TaskIoScope(router, "t1"),
    )


async def build(builder: Any, router: IoRouter, config: Any) -> tuple[CallList, TaskContext]:
    ctx = context(router)
    return await builder.build(ctx, config), ctx


async def test_block_table_makes_one_call_per_matching_row(router: IoRouter) -> None:
    config = {"function": "f", "table": "logs", "block": 4, "where": {"topic0": TRANSFER_TOPIC}}
    built, ctx = await build(BlockTableCallConfig(), router, config)
    assert built.function == "f"
    assert [c.args[0]["log_index"] for c in built.calls] == [0, 2]
    assert {c.args[0]["topic0"] for c in built.calls} == {TRANSFER_TOPIC}
    assert {c.context for c in built.calls} == {
        CallContext(block_number=4, block_hash=block_hash(4))
    }
    assert ctx.scan.table == "logs"
    assert ctx.scan.block_hashes == {4: block_hash(4)}
    assert ctx.scan.bundle_size is None
    # Two equality filters at once, one of them on another column.
    both = {**config, "where": {"topic0": OTHER_TOPIC, "transaction_index": 1}}
    built, _ = await build(BlockTableCallConfig(), router, both)
    assert [c.args[0]["log_index"] for c in built.calls] == [3]


async def test_block_table_unit_block_is_one_call_with_the_block_and_rows(
    router: IoRouter,
) -> None:
    config = {"function": "f", "table": "transactions", "block": 3, "unit": "block"}
    built, _ = await build(BlockTableCallConfig(), router, config)
    [call] = built.calls
    assert call.context == CallContext(block_number=3, block_hash=block_hash(3))
    argument = call.args[0]
    assert argument["block"]["block_hash"] == block_hash(3)
    assert [t["transaction_index"] for t in argument["rows"]] == [0, 1]
    # No matching row: still one call, with no rows.
    empty = {**config, "where": {"nonce": 99}}
    built, _ = await build(BlockTableCallConfig(), router, empty)
    assert [c.args[0]["rows"] for c in built.calls] == [[]]


async def test_block_table_pins_the_branch(router: IoRouter) -> None:
    pinned = {"number": 5, "hash": block_hash(5)}
    built, _ = await build(
        BlockTableCallConfig(), router, {"function": "f", "table": "blocks", "block": pinned}
    )
    assert [c.args[0]["block_number"] for c in built.calls] == [5]
    gone = {"number": 5, "hash": block_hash(5, branch=1)}
    with pytest.raises(PluginError, match="no longer canonical") as info:
        await build(
            BlockTableCallConfig(), router, {"function": "f", "table": "logs", "block": gone}
        )
    assert not info.value.retryable


async def test_a_block_not_yet_ingested_is_retryable(router: IoRouter) -> None:
    with pytest.raises(PluginError, match="block 10 is not in the block database yet") as info:
        await build(BlockTableCallConfig(), router, {"function": "f", "table": "logs", "block": 10})
    assert info.value.retryable
    assert "head is 9" in info.value.message
    config = {"function": "f", "table": "logs", "fromBlock": 8, "toBlock": 12}
    with pytest.raises(PluginError, match="block 10 is not in the block database yet") as info:
        await build(BlockBundleCallConfig(), router, config)
    assert info.value.retryable


async def test_block_bundle_reads_the_range_in_chunks(router: IoRouter) -> None:
    # 40 logs over 10 blocks, read within BLOCKDB_MAX_ROWS = 12.
    config = {"function": "f", "table": "logs", "fromBlock": 0, "toBlock": HEAD}
    built, ctx = await build(BlockBundleCallConfig(), router, config)
    assert [(c.args[0]["block_number"], c.args[0]["log_index"]) for c in built.calls] == [
        (n, i) for n in range(HEAD + 1) for i in range(4)
    ]
    for call in built.calls:
        assert call.context == CallContext(
            block_number=call.args[0]["block_number"], block_hash=call.args[0]["block_hash"]
        )
    assert ctx.scan.block_hashes == {n: block_hash(n) for n in range(HEAD + 1)}
    assert ctx.scan.bundle_size == 100


async def test_block_bundle_unit_block_is_one_call_per_block(router: IoRouter) -> None:
    config = {
        "function": "f",
        "table": "erc20_transfers",
        "fromBlock": 2,
        "toBlock": 6,
        "bundleSize": 2,
        "unit": "block",
        "where": {"token": TOKEN.upper().replace("0X", "0x"), "transaction_index": 1},
    }
    built, ctx = await build(BlockBundleCallConfig(), router, config)
    assert [c.context for c in built.calls] == [
        CallContext(block_number=n, block_hash=block_hash(n)) for n in range(2, 7)
    ]
    assert [len(c.args[0]["rows"]) for c in built.calls] == [1] * 5
    assert ctx.scan.bundle_size == 2


BAD = [
    (BlockTableCallConfig(), {"function": "f", "table": "reorgs", "block": 1}, "must be one of"),
    (BlockTableCallConfig(), {"function": "f", "table": "logs", "block": -1}, "expected"),
    (BlockTableCallConfig(), {"function": "f", "table": "logs", "block": True}, "expected"),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "logs", "block": {"number": 1, "hash": "x"}},
        "expected",
    ),
    (BlockTableCallConfig(), {"function": "", "table": "logs", "block": 1}, "must not be empty"),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "logs", "block": 1, "unit": "day"},
        "expected",
    ),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "logs", "block": 1, "where": {"nope; DROP": 1}},
        "has no column",
    ),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "logs", "block": 1, "where": {"address": "zz"}},
        "0x hex",
    ),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "logs", "block": 1, "where": {"address": [1]}},
        "single values",
    ),
    (
        BlockTableCallConfig(),
        {"function": "f", "table": "transactions", "block": 1, "where": {"value": "1"}},
        "cannot be filtered",
    ),
    (
        BlockBundleCallConfig(),
        {"function": "f", "table": "logs", "fromBlock": 5, "toBlock": 4},
        "is below fromBlock",
    ),
    (
        BlockBundleCallConfig(),
        {"function": "f", "table": "logs", "fromBlock": 1, "toBlock": 4, "bundleSize": 0},
        "expected",
    ),
    (
        BlockBundleCallConfig(),
        {"function": "f", "table": "logs", "from_block": 1, "toBlock": 4},
        "expected",
    ),
    (InputsCallConfig(), {"function": "f", "inputs": [[1]]}, "must be an object"),
    (InputsCallConfig(), {"function": "f", "inputs": [{"a b": 1}]}, "not a keyword"),
    (InputsCallConfig(), {"function": "f"}, "expected"),
]


@pytest.mark.parametrize(("builder", "config", "words"), BAD)
async def test_bad_configs_fail_not_retryable(
    router: IoRouter, builder: Any, config: Any, words: str
) -> None:
    with pytest.raises(PluginError, match=words) as info:
        await build(builder, router, config)
    assert not info.value.retryable, info.value.message


async def test_a_single_block_over_blockdb_max_rows_is_not_retryable(
    tmp_path: Path,
) -> None:
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/wide.db")
    store = await open_store(url)
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(0, txs=4)])
    await store.close()
    backend = BlockDbBackend(url, max_rows=5)
    await backend.start()
    try:
        config = {"function": "f", "table": "logs", "fromBlock": 0, "toBlock": 0}
        with pytest.raises(PluginError, match="BLOCKDB_MAX_ROWS") as info:
            await build(BlockBundleCallConfig(), open_router(None, blockdb=backend), config)
        assert not info.value.retryable
    finally:
        await backend.close()


async def test_inputs_become_keyword_arguments(router: IoRouter) -> None:
    config = {"function": "f", "inputs": [{"a": 1, "b": {"c": [2]}}, {}]}
    built, _ = await build(InputsCallConfig(), router, config)
    assert [(c.args, c.kwargs, c.context) for c in built.calls] == [
        ([], {"a": 1, "b": {"c": [2]}}, None),
        ([], {}, None),
    ]
    deep: Any = 1
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(PluginError, match="levels deep") as info:
        await build(InputsCallConfig(), router, {"function": "f", "inputs": [{"a": deep}]})
    assert not info.value.retryable
    ok: Any = 1
    for _ in range(MAX_DEPTH):
        ok = [ok]
    built, _ = await build(InputsCallConfig(), router, {"function": "f", "inputs": [{"a": ok}]})
    assert len(built.calls) == 1
