"""One ``function(name).call(...)`` everywhere: from a program it goes to a real
``blockx-syncinvoker``; inside a function on a real ``blockx-worker`` the SDK's
handle (and blockx_executor's) is a sub-call of the running call, in its task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from processes import (
    SyncInvokerProcess,
    WorkerProcess,
    call_list_task,
    execute_result,
    run_to_end,
    serving,
)

import blockx_executor
from blockx_client import Client, FunctionError
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

# blockx_executor only: executors running from the executor runtime import nothing else.
HANDLES = """
from blockx_executor import current_call, function


def whoami(greeting):
    info = current_call()
    return {"greeting": greeting, "task_id": info.task_id, "function": info.function}


def fails():
    raise ValueError("no")


async def through_blockx_executor(greeting):
    return await function("whoami").call(greeting)
"""

# The SDK's handle inside a function: blockx_client is importable where executors
# run as the Worker's own user, from its environment (EXECUTOR_USER=-).
SDK = """
from blockx_client import Client, FunctionError, SyncClient


async def through_the_sdk(greeting):
    async with Client() as client:
        return await client.function("whoami").call(greeting)


async def a_failed_sub_call():
    async with Client() as client:
        try:
            await client.function("fails").call()
        except FunctionError as exc:
            return [exc.kind, exc.retryable, exc.detail]


async def invoke_inside():
    async with Client() as client:
        try:
            await client.function("whoami").invoke("x")
        except RuntimeError as exc:
            return str(exc)


def sync_client_inside():
    with SyncClient() as client:
        try:
            return client.function("whoami").call("x")
        except RuntimeError as exc:
            return str(exc)
"""


def functions_dir(root: Path, **modules: str) -> Path:
    root.mkdir()
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source)
    return root


def outputs(update: worker_v1.TaskUpdate) -> list[Any]:
    assert update.state == worker_v1.TaskState.SUCCEEDED, update
    value: list[Any] = json.loads(execute_result(update).plugin_results[0].result)
    return value


async def test_outside_an_executor_the_call_goes_to_the_sync_invoker(tmp_path: Path) -> None:
    invoker = SyncInvokerProcess(
        {"FUNCTIONS_DIR": str(functions_dir(tmp_path / "functions", handles=HANDLES))},
        tmp_path / "syncinvoker.log",
    )
    try:
        await invoker.wait_ready()
        async with Client(sync_invoker=invoker.addr) as client:
            value = await client.function("whoami").call("hi")
            assert value["task_id"].startswith("invoke-")  # the Sync Invoker's own
            assert (value["greeting"], value["function"]) == ("hi", "whoami")
            # A function that makes a sub-call through blockx_executor's handle.
            value = await client.function("through_blockx_executor").call("via")
            assert (value["greeting"], value["function"]) == ("via", "whoami")
            with pytest.raises(FunctionError, match="ValueError: no"):
                await client.function("fails").call()
        # blockx_executor's own handle has no Sync Invoker to go to: it says what to use.
        with pytest.raises(RuntimeError, match=r"Client\(\)\.function\('whoami'\)\.call"):
            await blockx_executor.function("whoami").call("hi")
    finally:
        assert invoker.stop() == 0
    assert "Traceback" not in invoker.output()


async def test_inside_a_function_the_sdk_handle_is_a_sub_call(
    etcd_server: EtcdServer, unique_lane: Any, tmp_path: Path
) -> None:
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "FUNCTIONS_DIR": str(functions_dir(tmp_path / "functions", handles=HANDLES, sdk=SDK)),
            "EXECUTOR_COUNT": "1",
            "EXECUTOR_USER": "-",
        },
        tmp_path / "worker.log",
    )
    async with serving(worker) as (stub,):
        task = call_list_task("t-sdk", "through_the_sdk", [["a"], ["b"]])
        # Each sub-call ran in the task itself: no Sync Invoker runs here at all.
        assert outputs(await run_to_end(stub, task)) == [
            {"greeting": "a", "task_id": "t-sdk", "function": "whoami"},
            {"greeting": "b", "task_id": "t-sdk", "function": "whoami"},
        ]
        task = call_list_task("t-executor", "through_blockx_executor", [["c"]])
        assert outputs(await run_to_end(stub, task)) == [
            {"greeting": "c", "task_id": "t-executor", "function": "whoami"}
        ]
        # A failed sub-call is the same FunctionError as a failed Sync Invoker call.
        task = call_list_task("t-fails", "a_failed_sub_call", [[]])
        [[kind, _, detail]] = outputs(await run_to_end(stub, task))
        assert kind == "USER_ERROR"
        assert "ValueError: no" in detail
        # What only a program can do says so instead of failing on the sandbox.
        task = call_list_task("t-invoke", "invoke_inside", [[]])
        assert outputs(await run_to_end(stub, task)) == [
            "function('whoami').invoke() asks the Sync Invoker, which a BlockX function "
            "cannot reach: use .call(...), a sub-call of the running call"
        ]
        task = call_list_task("t-sync", "sync_client_inside", [[]])
        assert outputs(await run_to_end(stub, task)) == [
            "SyncClient cannot call 'whoami' from inside a BlockX function: a plain def "
            "cannot wait for a sub-call; make the function async def and await "
            "Client().function('whoami').call(...)"
        ]
