"""The table Writer Plugins through a real writer scope, router, ``io.sink`` and
``io.blockdb``, on SQLite and PostgreSQL: rows grouped per block and per bundle,
empty blocks in the ledger, reorged blocks refused, retryable versus not, and
the sink's writes out of a function's (read-only) reach."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chain_rows import GENESIS, block_hash, make_block

from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.calls import CallContext, RootOutput
from blockx_core.chains import DEFAULT_CHAIN, Chain
from blockx_core.code_view import CodeSnapshot, FunctionSource
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.sink import SinkBackend
from blockx_server.io.config import open_router
from blockx_server.io.errors import IoFailed
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.io.settings import IoSettings
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.writers import PluginError, Writers
from blockx_server.pipeline.writers.block_bundle_write import BlockBundleWriteResultHandler
from blockx_server.pipeline.writers.block_write import BlockWriteResultHandler, rows_per_block
from blockx_server.pipeline.writers.table_upserts import TableUpsertsResultHandler

EPOCH = 4
CHAIN_ID = 31337
# The chain of a Worker configured by BLOCKDB_URL alone, as the block database's.
DEVNET = Chain(DEFAULT_CHAIN, CHAIN_ID)


@dataclass
class Stack:
    router: IoRouter
    sink: SinkStore
    writers: Writers


def _writers(bundle: bool) -> Writers:
    """The registrations of the block (or bundle) cluster."""
    writers = Writers("Writer Plugin")
    if bundle:
        writers.register(
            "BlockBundleWriteResultHandler",
            BlockBundleWriteResultHandler(),
            aliases=["BlockTableWriteHandler"],
        )
    else:
        writers.register(
            "BlockWriteResultHandler", BlockWriteResultHandler(), aliases=["BlockTableWriteHandler"]
        )
    writers.register(
        "TableUpsertsResultHandler",
        TableUpsertsResultHandler(),
        aliases=["NormalTableWriteHandler"],
    )
    return writers


@pytest.fixture
async def stack(db_url: str) -> AsyncIterator[Stack]:
    """Blocks 1..6 ingested; the sink is the block database itself."""
    url = parse_blockdb_url(db_url)
    store = await open_store(url)
    async with store.writer() as w:
        await w.init_chain(CHAIN_ID, GENESIS)
        await w.insert_blocks([make_block(n, txs=1) for n in range(1, 7)])
        await w.set_chain(head_number=6, head_hash=block_hash(6), finalized_number=1, epoch=0)
    await store.close()
    blockdb, sink_backend = BlockDbBackend(url, 1000), SinkBackend(url)
    router = open_router(None, (), blockdb, sink=sink_backend, settings=IoSettings())
    reader = await open_sink(url)
    yield Stack(router, reader, _writers(bundle=False))
    await reader.close()
    await sink_backend.close()
    await blockdb.close()


# The task's module set, which the writers hand the sink with the rows.
SOURCE = "def f(block):\n    return {'v': 1}\n"
CODE = CodeSnapshot(
    epoch=EPOCH,
    modules={"fns": FunctionSource("fns", SOURCE, hashlib.sha256(SOURCE.encode()).hexdigest())},
    functions={"f": "fns"},
    parse_errors={},
)


def _ctx(router: IoRouter, *, writes: bool = True, chain: Chain | None = DEVNET) -> TaskContext:
    task = TaskInput(task_id="task-1", function_call_config=PluginConfig(type="CallListCallConfig"))
    scope = TaskIoScope(router, "task-1")
    return TaskContext(
        task=task,
        deadline_ms=0,
        code=CODE,
        io=scope.writer() if writes else scope,
        chain=chain,
    )


def _out(index: int, value: Any, number: int, branch: int = 0) -> RootOutput:
    context = CallContext(block_number=number, block_hash=block_hash(number, branch))
    return RootOutput(index, msgspec.json.encode(value), context)


async def _run(
    writers: Writers,
    router: IoRouter,
    name: str,
    config: Any,
    outputs: Any,
    *,
    chain: Chain | None = DEVNET,
) -> Any:
    plugin = writers.get(name)
    assert plugin is not None
    return msgspec.json.decode(await plugin.execute(_ctx(router, chain=chain), config, outputs))


async def test_block_writer_groups_rows_per_block_and_records_empty_blocks(stack: Stack) -> None:
    outputs = [
        _out(0, {"v": 1}, 2),
        _out(1, [{"v": 2}, {"v": 3}], 3),
        _out(2, None, 4),
        _out(3, {"v": 4}, 2),
        _out(4, [], 5),
    ]
    result = await _run(
        stack.writers, stack.router, "BlockTableWriteHandler", {"table": "t"}, outputs
    )
    assert result == {"table": "t", "blocks": 4, "rows": 4}
    rows = await stack.sink.rows("t")
    assert [(r["block_number"], r["row_index"], r["v"]) for r in rows] == [
        (2, 0, 1),
        (2, 1, 4),
        (3, 0, 2),
        (3, 1, 3),
    ]
    assert {r["code_epoch"] for r in rows} == {EPOCH}
    ledger = await stack.sink.written("t", CHAIN_ID)
    assert [(r["block_number"], r["block_hash"], r["task_id"]) for r in ledger] == [
        (n, block_hash(n), "task-1") for n in (2, 3, 4, 5)
    ]
    # The sink keeps the code that wrote them.
    (written,) = await stack.sink.code_of("t", 3)
    assert written.code is not None
    assert (written.code.code_digest, written.code.sources) == (CODE.digest, {"fns": SOURCE})
    # Re-running leaves exactly the last run's rows.
    await _run(stack.writers, stack.router, "BlockWriteResultHandler", {"table": "t"}, outputs[:1])
    assert [r["v"] for r in await stack.sink.rows("t")] == [1, 2, 3]


async def test_bundle_writer_writes_one_transaction_per_bundle(stack: Stack) -> None:
    writers = _writers(bundle=True)
    outputs = [_out(i, {"n": n}, n) for i, n in enumerate(range(1, 7))]
    config = {"table": "b", "bundleSize": 4, "key": ["block_number"]}
    result = await _run(writers, stack.router, "BlockTableWriteHandler", config, outputs)
    assert result == {"table": "b", "bundles": 2, "blocks": 6, "rows": 6}
    assert [r["n"] for r in await stack.sink.rows("b")] == [1, 2, 3, 4, 5, 6]
    assert writers.get("BlockWriteResultHandler") is None


async def test_a_reorged_block_is_not_written_and_the_failure_is_retryable(stack: Stack) -> None:
    outputs = [_out(0, {"v": 1}, 2), _out(1, {"v": 2}, 3, branch=1)]
    with pytest.raises(PluginError, match=r"block 3 \(0x") as failed:
        await _run(stack.writers, stack.router, "BlockWriteResultHandler", {"table": "r"}, outputs)
    assert failed.value.retryable
    assert await stack.sink.written("r", CHAIN_ID) == []


async def test_rows_that_do_not_fit_fail_not_retryable_naming_the_column(stack: Stack) -> None:
    run = stack.writers, stack.router, "BlockWriteResultHandler"
    await _run(*run, {"table": "s"}, [_out(0, {"v": 1}, 2)])
    with pytest.raises(PluginError, match="column 'v'") as failed:
        await _run(*run, {"table": "s"}, [_out(0, {"v": "x"}, 2)])
    assert not failed.value.retryable
    with pytest.raises(PluginError, match="carries block_number 9") as failed:
        await _run(*run, {"table": "s"}, [_out(0, {"v": 1, "block_number": 9}, 2)])
    assert not failed.value.retryable
    with pytest.raises(PluginError, match="returned int") as failed:
        await _run(*run, {"table": "s"}, [_out(0, 5, 2)])
    assert not failed.value.retryable
    with pytest.raises(PluginError, match="block database table") as failed:
        await _run(*run, {"table": "logs"}, [_out(0, {"v": 1}, 2)])
    assert not failed.value.retryable
    with pytest.raises(PluginError, match="config") as failed:
        await _run(*run, {"tabel": "s"}, [_out(0, {"v": 1}, 2)])
    assert not failed.value.retryable
    assert [r["v"] for r in await stack.sink.rows("s")] == [1]


async def test_a_writer_meant_for_another_sink_fails_not_retryable_writing_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    other = await open_sink(parse_blockdb_url(f"sqlite:///{tmp_path}/other.db"))
    try:
        meant = await other.identity()
    finally:
        await other.close()
    mine = await stack.sink.identity()
    cases = [
        ("BlockWriteResultHandler", stack.writers, {"table": "m"}),
        ("BlockBundleWriteResultHandler", _writers(bundle=True), {"table": "m"}),
        ("TableUpsertsResultHandler", stack.writers, {"table": "m", "key": "v"}),
    ]
    for name, writers, config in cases:
        with pytest.raises(PluginError, match=f"identity {mine}.*identity {meant}") as failed:
            await _run(
                writers,
                stack.router,
                name,
                {**config, "sinkIdentity": meant},
                [_out(0, {"v": 1}, 2)],
            )
        assert not failed.value.retryable
        # Even a task with nothing to write is refused.
        with pytest.raises(PluginError, match=meant):
            await _run(writers, stack.router, name, {**config, "sinkIdentity": meant}, [])
    assert (await stack.sink.rows("m"), await stack.sink.written("m", CHAIN_ID)) == ([], [])
    config = {"table": "m", "sinkIdentity": mine}
    assert await _run(
        stack.writers, stack.router, "BlockWriteResultHandler", config, [_out(0, {"v": 1}, 2)]
    ) == {
        "table": "m",
        "blocks": 1,
        "rows": 1,
    }


async def test_a_block_writer_needs_the_chain_its_driver_planned_from(stack: Stack) -> None:
    outputs = [_out(0, {"v": 1}, 2)]
    runs = [
        (writers, stack.router, name)
        for name, writers in (
            ("BlockWriteResultHandler", stack.writers),
            ("BlockBundleWriteResultHandler", _writers(bundle=True)),
        )
    ]
    for run in runs:
        with pytest.raises(PluginError, match=r"chain id 31337 on this Worker.*chain id 8453"):
            await _run(*run, {"table": "w", "chainId": 8453}, outputs)
        with pytest.raises(PluginError, match="the task has no chain") as failed:
            await _run(*run, {"table": "w"}, outputs, chain=None)
        assert not failed.value.retryable
    assert await stack.sink.written("w", CHAIN_ID) == []
    for run in runs:
        # Another chain's rows of the same blocks are its own.
        base = Chain("base", 8453)
        await _run(*run, {"table": "w", "chainId": 8453}, outputs, chain=base)
        await _run(*run, {"table": "w", "chainId": CHAIN_ID}, [_out(0, {"v": 2}, 2)])
    rows = await stack.sink.rows("w")
    assert [(r["chain_id"], r["block_number"], r["v"]) for r in rows] == [
        (8453, 2, 1),
        (CHAIN_ID, 2, 2),
    ]


async def test_upserts_by_key(stack: Stack) -> None:
    run = stack.writers, stack.router, "NormalTableWriteHandler"
    config = {"table": "u", "key": "who"}
    await _run(*run, config, [_out(0, [{"who": "a", "n": 1}, {"who": "b", "n": 1}], 2)])
    assert await _run(*run, config, [_out(0, {"who": "a", "n": 7}, 3), _out(1, None, 3)]) == {
        "table": "u",
        "rows": 1,
    }
    assert sorted((r["who"], r["n"]) for r in await stack.sink.rows("u")) == [("a", 7), ("b", 1)]
    kept = await stack.sink.code_of_task("task-1")
    assert kept is not None
    assert (kept.kind, kept.table, kept.code_epoch, kept.sources) == (
        "upsert",
        "u",
        EPOCH,
        {"fns": SOURCE},
    )
    with pytest.raises(PluginError, match="key") as failed:
        await _run(*run, {"table": "u"}, [_out(0, {"who": "a"}, 2)])
    assert not failed.value.retryable


async def test_a_function_scope_cannot_write_the_sink(stack: Stack) -> None:
    reader = _ctx(stack.router, writes=False).io
    for op in ("replace_blocks", "upsert"):
        outcome = await reader.request("sink", op, ["t", []])
        assert isinstance(outcome, IoFailed), outcome
        assert outcome.kind == "WRITE_FORBIDDEN"
        assert not outcome.retryable


async def test_an_unreachable_sink_is_retryable_and_a_missing_one_is_not(tmp_path: Path) -> None:
    gone = SinkBackend(parse_blockdb_url(f"sqlite:///{tmp_path}/no/such/dir/sink.db"))
    router = open_router(None, sink=gone, settings=IoSettings(retry_max_attempts=1))
    with pytest.raises(PluginError, match="UNAVAILABLE") as failed:
        await _run(
            _writers(False), router, "BlockWriteResultHandler", {"table": "t"}, [_out(0, {}, 1)]
        )
    assert failed.value.retryable
    without = open_router(None, settings=IoSettings(retry_max_attempts=1))
    with pytest.raises(PluginError, match="SINK_DB_URL") as failed:
        await _run(
            _writers(False),
            without,
            "NormalTableWriteHandler",
            {"table": "t", "key": "k"},
            [_out(0, {"k": 1}, 1)],
        )
    assert not failed.value.retryable


async def test_a_reorged_bundle_stops_the_bundle_writer_after_the_bundles_before_it(
    stack: Stack,
) -> None:
    writers = _writers(bundle=True)
    outputs = [_out(0, {"n": 1}, 1), _out(1, {"n": 2}, 2), _out(2, {"n": 5}, 5, branch=1)]
    with pytest.raises(PluginError, match="block 5") as failed:
        await _run(
            writers,
            stack.router,
            "BlockTableWriteHandler",
            {"table": "c", "bundleSize": 2},
            outputs,
        )
    assert failed.value.retryable
    assert [r["block_number"] for r in await stack.sink.written("c", CHAIN_ID)] == [1, 2]


async def test_covered_blocks_without_calls_are_written_empty() -> None:
    covered = {n: block_hash(n) for n in (3, 4, 5)}
    blocks = rows_per_block([_out(0, {"v": 1}, 4)], "W", covered)
    assert blocks == [
        (3, block_hash(3), []),
        (4, block_hash(4), [{"v": 1}]),
        (5, block_hash(5), []),
    ]
    with pytest.raises(PluginError, match="two hashes"):
        rows_per_block([_out(0, {"v": 1}, 4, branch=1)], "W", covered)


BAD_OUTPUTS = [
    # (the value_json of output 1, between two good ones; the error)
    (b"{", "output 1 is no JSON"),
    (b'1, {"v": 9}', "output 1 is no JSON"),  # decoded together, this would be two values
    (b"", "output 1 is no JSON"),
    (b"5", "call 1 returned int"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_OUTPUTS)
def test_an_output_that_is_no_rows_is_named(raw: bytes, message: str) -> None:
    context = CallContext(block_number=2, block_hash=block_hash(2))
    outputs = [_out(0, {"v": 1}, 2), RootOutput(1, raw, context), _out(2, {"v": 2}, 2)]
    with pytest.raises(PluginError, match=message):
        rows_per_block(outputs, "W")
