"""worker.v1 input validation and phase outcomes, against one real Worker process."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from processes import EXAMPLES, WorkerProcess

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def echo(x):
    return x

def boom(x):
    raise ValueError(f"no good: {x}")
"""


@pytest.fixture(scope="module")
def worker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    d = tmp_path_factory.mktemp("contract")
    (d / "functions").mkdir()
    shutil.copy(EXAMPLES / "functions" / "hello.py", d / "functions" / "hello.py")
    (d / "functions" / "contract.py").write_text(FUNCTIONS)
    process = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": "/blockx/test/lanes/contract/workers/",
            "FUNCTIONS_DIR": str(d / "functions"),
            "MAX_TASK_TIMEOUT_MS": "60000",
            "TASK_DEADLINE_MS": "30000",
        },
        d / "worker.log",
    )
    asyncio.run(process.wait_ready())
    yield process
    assert process.stop() == 0


@pytest.fixture
async def stub(worker: WorkerProcess) -> AsyncIterator[worker_v1.WorkerServiceStub]:
    channel = worker.channel()
    yield worker_v1.WorkerServiceStub(channel)
    channel.close()


def make_task(
    task_id: str,
    config: Any = None,
    *,
    builder: str = "CallListCallConfig",
    handler: str | None = "ReturnValueResultHandler",
    timeout_ms: int = 0,
    raw_config: str | None = None,
    raw_handler_config: str = "{}",
) -> worker_v1.TaskInput:
    text = raw_config if raw_config is not None else json.dumps(config)
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(type=builder, config=text),
        result_handler=(
            worker_v1.ResultHandler(type=handler, config=raw_handler_config) if handler else None
        ),
        task_timeout_ms=timeout_ms,
    )


async def finish(
    stub: worker_v1.WorkerServiceStub, task: worker_v1.TaskInput
) -> worker_v1.TaskUpdate:
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=task))
    async with asyncio.timeout(30):
        updates = [
            u async for u in stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=[task.task_id]))
        ]
    return updates[-1]


def execute_result(update: worker_v1.TaskUpdate) -> worker_v1.ExecuteResult:
    assert update.result is not None
    assert update.result.execute_result is not None
    return update.result.execute_result


async def rejected(call: Any) -> tuple[Status, str]:
    with pytest.raises(GRPCError) as err:
        await call
    return err.value.status, err.value.message or ""


@pytest.mark.parametrize(
    ("task", "words"),
    [
        (make_task("", {"function": "echo", "callList": [[1]]}), "task_id"),
        (make_task("v1", raw_config="{not json"), "function_call_config.config is not valid JSON"),
        (
            make_task("v2", {"function": "echo", "callList": []}, raw_handler_config="[1,"),
            "result_handler.config is not valid JSON",
        ),
        (make_task("v3", {"function": "echo", "callList": []}, builder=""), "type is required"),
        (make_task("v4", {"function": "echo", "callList": []}, timeout_ms=-1), "task_timeout_ms"),
        (
            make_task("v5", {"function": "echo", "callList": []}, timeout_ms=60_001),
            "MAX_TASK_TIMEOUT_MS",
        ),
        (
            make_task("x" * 257, {"function": "echo", "callList": []}),
            "task.task_id is 257 bytes long; at most 256",
        ),
    ],
)
async def test_bad_input_is_invalid_argument(
    stub: worker_v1.WorkerServiceStub, task: worker_v1.TaskInput, words: str
) -> None:
    status, message = await rejected(stub.submit_task(worker_v1.SubmitTaskRequest(task=task)))
    assert status is Status.INVALID_ARGUMENT
    assert words in message


async def test_missing_task_is_invalid_argument(stub: worker_v1.WorkerServiceStub) -> None:
    status, message = await rejected(stub.submit_task(worker_v1.SubmitTaskRequest()))
    assert (status, message) == (Status.INVALID_ARGUMENT, "task is required")


@pytest.mark.parametrize(
    ("task_id", "ttl", "words"),
    [
        ("", 1000, "task_id is required"),
        ("t", 0, "ttl_ms must be > 0"),
        ("t", -5, "ttl_ms must be > 0"),
        # A lease no one could end until a restart.
        ("t", 2**63 - 1, "exceeds MAX_SLOT_TTL_MS (60000)"),
        ("é" * 129, 1000, "task_id is 258 bytes long"),
    ],
)
async def test_request_task_slot_validation(
    stub: worker_v1.WorkerServiceStub, task_id: str, ttl: int, words: str
) -> None:
    status, message = await rejected(
        stub.request_task_slot(worker_v1.RequestTaskSlotRequest(task_id=task_id, ttl_ms=ttl))
    )
    assert status is Status.INVALID_ARGUMENT
    assert words in message


@pytest.mark.parametrize(
    ("task", "code", "retryable", "words"),
    [
        (
            make_task("b1", {"function": "echo"}),
            "BUILDER_FAILED",
            False,
            "CallListCallConfig",
        ),
        (
            make_task("b2", {"function": "echo", "callList": [[1]]}, builder="NoSuchBuilder"),
            "BUILDER_NOT_FOUND",
            False,
            "NoSuchBuilder",
        ),
        (
            make_task("b3", {"function": "echo", "callList": [[1]]}, handler="NoSuchPlugin"),
            "PLUGIN_NOT_FOUND",
            False,
            "NoSuchPlugin",
        ),
        (
            make_task("b4", {"function": "boom", "callList": [[1], [2]]}),
            "CALL_FAILED",
            False,
            "ValueError: no good: ",  # whichever root call failed first
        ),
        (
            make_task("b5", {"function": "nope", "callList": [[1]]}),
            "CALL_FAILED",
            False,
            "FUNCTION_NOT_FOUND",
        ),
    ],
)
async def test_failures_converge_with_their_code(
    stub: worker_v1.WorkerServiceStub,
    task: worker_v1.TaskInput,
    code: str,
    retryable: bool,
    words: str,
) -> None:
    final = await finish(stub, task)
    assert final.state is worker_v1.TaskState.FAILED
    result = execute_result(final)
    assert result.failure_code == code
    assert result.retryable is retryable
    assert words in result.failure_message


async def test_plugin_not_found_names_the_plugin_in_plugin_results(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    final = await finish(
        stub, make_task("p1", {"function": "echo", "callList": [[1]]}, handler="X")
    )
    [plugin] = execute_result(final).plugin_results
    assert (plugin.plugin_name, plugin.success, plugin.failure_code) == (
        "X",
        False,
        "PLUGIN_NOT_FOUND",
    )


async def test_without_a_result_handler_plugin_results_are_empty(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    final = await finish(
        stub, make_task("h0", {"function": "echo", "callList": [[1]]}, handler=None)
    )
    assert final.state is worker_v1.TaskState.SUCCEEDED
    assert execute_result(final).plugin_results == []


async def test_the_seed_003_spelling_of_the_handler_is_accepted(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    task = make_task(
        "alias", {"function": "echo", "callList": [[1], [2]]}, handler="ReturnValueHandler"
    )
    final = await finish(stub, task)
    [plugin] = execute_result(final).plugin_results
    assert plugin.plugin_name == "ReturnValueHandler"
    assert json.loads(plugin.result) == [1, 2]


async def test_an_empty_call_list_succeeds_with_no_outputs(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    final = await finish(stub, make_task("empty", {"function": "echo", "callList": []}))
    assert final.state is worker_v1.TaskState.SUCCEEDED
    assert json.loads(execute_result(final).plugin_results[0].result) == []


async def test_io_and_sub_calls_through_the_example(stub: worker_v1.WorkerServiceStub) -> None:
    task = make_task("io", {"function": "greet_account", "callList": [["0xabc"], ["0x0"]]})
    final = await finish(stub, task)
    assert json.loads(execute_result(final).plugin_results[0].result) == [
        {"address": "0xabc", "balance": "1.5000 ETH"},
        {"address": "0x0", "balance": "0.0000 ETH"},
    ]


async def test_watch_snapshot_for_known_and_unknown_ids(stub: worker_v1.WorkerServiceStub) -> None:
    await finish(stub, make_task("w-done", {"function": "echo", "callList": [[1]]}))
    async with asyncio.timeout(10):
        updates = [
            u
            async for u in stub.watch_tasks(
                worker_v1.WatchTasksRequest(task_ids=["w-done", "w-unknown", "w-done"])
            )
        ]
    assert [(u.task_id, u.is_terminal, u.error) for u in updates] == [
        ("w-done", True, ""),
        ("w-unknown", True, "not_found"),
    ]
    assert updates[0].state is worker_v1.TaskState.SUCCEEDED


async def test_concurrent_submissions_of_one_task_id_run_it_once(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    task = make_task("once", {"function": "echo", "callList": [[5]]})
    answers = await asyncio.gather(
        *(stub.submit_task(worker_v1.SubmitTaskRequest(task=task)) for _ in range(10))
    )
    assert {a.slot_id for a in answers} == {answers[0].slot_id}
    final = await finish(stub, task)
    assert json.loads(execute_result(final).plugin_results[0].result) == [5]


async def test_an_oversized_task_id_is_refused_without_echoing_it(
    stub: worker_v1.WorkerServiceStub,
) -> None:
    huge = "z" * 1_000_000
    status, message = await rejected(
        stub.get_task_result(worker_v1.GetTaskResultRequest(task_id=huge))
    )
    assert status is Status.INVALID_ARGUMENT
    assert "1000000 bytes long" in message
    assert len(message) < 200
    status, message = await rejected(
        _first(stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=["ok", huge])))
    )
    assert (status, len(message) < 200) == (Status.INVALID_ARGUMENT, True)


async def test_a_watch_of_too_many_ids_is_refused(stub: worker_v1.WorkerServiceStub) -> None:
    ids = [f"w-{n}" for n in range(10_001)]
    status, message = await rejected(
        _first(stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=ids)))
    )
    assert status is Status.INVALID_ARGUMENT
    assert "10001 task_ids in one WatchTasks; at most 10000" in message


async def _first(updates: AsyncIterator[worker_v1.TaskUpdate]) -> worker_v1.TaskUpdate:
    async for update in updates:
        return update
    raise AssertionError("the stream ended without an update")


async def test_get_task_result_of_an_unknown_task(stub: worker_v1.WorkerServiceStub) -> None:
    status, message = await rejected(
        stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="never-seen"))
    )
    assert status is Status.NOT_FOUND
    assert "never-seen" in message


async def test_metrics_endpoint(worker: WorkerProcess, stub: worker_v1.WorkerServiceStub) -> None:
    await finish(stub, make_task("m1", {"function": "echo", "callList": [[1]]}))
    body = await asyncio.to_thread(worker.metrics)
    assert 'blockx_worker_slots{state="free"}' in body
    assert "blockx_worker_executors_up 2.0" in body
    assert 'blockx_worker_tasks_total{failure_code="",state="SUCCEEDED"}' in body
    assert "blockx_worker_ready 1.0" in body
