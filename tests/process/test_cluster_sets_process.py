"""The two clusters' plug-in sets on real Workers: a ``blockx-worker`` and a
``blockx-bundle-worker`` over one SQLite block database (BLOCKDB_URL) run the chain
Builders end to end, and refuse what the other cluster serves, naming it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from chain_rows import block_hash, seed_chain
from processes import WorkerProcess, execute_result, run_to_end, serving

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_core.registry import RegistryKind
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
from blockx_executor import current_call

def where(row):
    call = current_call()
    return [row["block_number"], row["log_index"], call.block_number, call.block_hash]

def per_block(arg):
    call = current_call()
    return [arg["block"]["block_number"], len(arg["rows"]), call.block_hash]

def add(a, b):
    return a + b
"""
HEAD = 7


def task(
    task_id: str, builder: str, config: dict[str, Any], handler: str | None = None
) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(type=builder, config=json.dumps(config)),
        result_handler=None
        if handler is None
        else worker_v1.ResultHandler(type=handler, config="{}"),
    )


RETURN = "ReturnValueResultHandler"


@pytest.fixture
async def workers(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> AsyncIterator[tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub]]:
    url = f"sqlite:///{tmp_path}/chain.db"
    await seed_chain(url, HEAD + 1)  # blocks 0..HEAD, finalized HEAD - 4
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "chainfns.py").write_text(FUNCTIONS)
    env = {
        "ETCD_ENDPOINTS": etcd_server.endpoint,
        "FUNCTIONS_DIR": str(functions),
        "BLOCKDB_URL": url,
        # 4 logs a block: a bundle of 8 blocks is read in several chunks.
        "BLOCKDB_MAX_ROWS": "10",
    }
    block = WorkerProcess({**env, "WORKER_REGISTRY_PREFIX": unique_lane()}, tmp_path / "block.log")
    bundle = WorkerProcess(
        {**env, "WORKER_REGISTRY_PREFIX": unique_lane(RegistryKind.BUNDLE)},
        tmp_path / "bundle.log",
        program="blockx-bundle-worker",
    )
    async with serving(block, bundle) as (block_stub, bundle_stub):
        yield block_stub, bundle_stub


async def succeeded(stub: worker_v1.WorkerServiceStub, t: worker_v1.TaskInput) -> Any:
    final = await run_to_end(stub, t, timeout=30)
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    result = execute_result(final)
    return json.loads(result.plugin_results[0].result) if result.plugin_results else None


async def failed(stub: worker_v1.WorkerServiceStub, t: worker_v1.TaskInput) -> Any:
    final = await run_to_end(stub, t, timeout=30)
    assert final.state is worker_v1.TaskState.FAILED, final
    return execute_result(final)


async def test_the_block_worker_runs_every_builder_of_its_cluster(
    workers: tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub],
) -> None:
    block, _ = workers
    rows = await succeeded(
        block,
        task(
            "t-table",
            "BlockTableCallConfig",
            {"function": "where", "table": "logs", "block": 5, "where": {"topic0": TRANSFER_TOPIC}},
            RETURN,
        ),
    )
    assert rows == [[5, 0, 5, block_hash(5)], [5, 2, 5, block_hash(5)]]
    pinned = {"number": 2, "hash": block_hash(2)}
    per_block = await succeeded(
        block,
        task(
            "t-pinned",
            "BlockTableCallConfig",
            {"function": "per_block", "table": "transactions", "block": pinned, "unit": "block"},
            RETURN,
        ),
    )
    assert per_block == [[2, 2, block_hash(2)]]
    bundle = await succeeded(
        block,
        task(
            "t-bundle",
            "BlockBundleCallConfig",
            {
                "function": "per_block",
                "table": "logs",
                "fromBlock": 0,
                "toBlock": HEAD,
                "unit": "block",
            },
            RETURN,
        ),
    )
    assert bundle == [[n, 4, block_hash(n)] for n in range(HEAD + 1)]
    inputs = {"function": "add", "inputs": [{"a": 1, "b": 2}, {"b": "y", "a": "x"}]}
    assert await succeeded(block, task("t-inputs", "InputsCallConfig", inputs, RETURN)) == [3, "xy"]
    listed = {"function": "add", "callList": [[2, 3]]}
    assert await succeeded(block, task("t-list", "CallListCallConfig", listed, RETURN)) == [5]


async def test_chain_builder_failures_say_whether_to_retry(
    workers: tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub],
) -> None:
    block, bundle = workers
    gone = {"number": 4, "hash": block_hash(4, branch=1)}
    config: dict[str, Any] = {"function": "where", "table": "logs", "block": gone}
    result = await failed(block, task("t-gone", "BlockTableCallConfig", config, RETURN))
    assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", False)
    assert "no longer canonical" in result.failure_message
    config = {"function": "where", "table": "logs", "fromBlock": 6, "toBlock": 9}
    result = await failed(bundle, task("t-ahead", "BlockBundleCallConfig", config))
    assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", True)
    assert "block 8 is not in the block database yet" in result.failure_message
    config = {"function": "where", "table": "logs", "block": 1, "where": {"nope": 1}}
    result = await failed(block, task("t-column", "BlockTableCallConfig", config, RETURN))
    assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", False)
    assert "logs has no column 'nope'" in result.failure_message


async def test_each_worker_refuses_the_other_clusters_plugins_by_name(
    workers: tuple[worker_v1.WorkerServiceStub, worker_v1.WorkerServiceStub],
) -> None:
    block, bundle = workers
    bundle_config = {"function": "where", "table": "logs", "fromBlock": 0, "toBlock": 1}
    # The bundle Worker runs its own builders (here with no writer)...
    assert await succeeded(bundle, task("b-ok", "BlockBundleCallConfig", bundle_config)) is None
    inputs = {"function": "add", "inputs": [{"a": 1, "b": 2}]}
    assert await succeeded(bundle, task("b-inputs", "InputsCallConfig", inputs)) is None
    # ...but neither CallListCallConfig, BlockTableCallConfig nor ReturnValue.
    listed = {"function": "add", "callList": [[2, 3]]}
    result = await failed(bundle, task("b-list", "CallListCallConfig", listed, RETURN))
    assert result.failure_code == "BUILDER_NOT_FOUND"
    assert "CallListCallConfig runs on the block cluster" in result.failure_message
    table = {"function": "where", "table": "logs", "block": 1}
    result = await failed(bundle, task("b-table", "BlockTableCallConfig", table))
    assert "BlockTableCallConfig runs on the block cluster" in result.failure_message
    for name in ("ReturnValueResultHandler", "ReturnValueHandler"):
        result = await failed(bundle, task(f"b-{name}", "InputsCallConfig", inputs, name))
        assert result.failure_code == "PLUGIN_NOT_FOUND"
        assert f"{name} runs on the block cluster" in result.failure_message
    handler = "BlockBundleWriteResultHandler"
    result = await failed(block, task("k-bundle-writer", "InputsCallConfig", inputs, handler))
    assert result.failure_code == "PLUGIN_NOT_FOUND"
    assert f"{handler} runs on the bundle cluster" in result.failure_message
