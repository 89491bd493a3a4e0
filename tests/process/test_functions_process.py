"""A real ``blockx-worker`` with its own FUNCTIONS_DIR: modules importing each other
across code epochs, and a resubmitted task_id whose input changed, as the wire, the
SDK and the CLI report it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from processes import WorkerProcess, call_list_task, execute_result, run_to_end, serving
from support import wait_until
from typer.testing import CliRunner

from blockx_cli.app import app
from blockx_client import Client, Task, TaskInputDiffersError, TaskState
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

MAIN = """
import helpers
from . import helpers as relative

def value(x):
    return [x, helpers.VALUE, relative.VALUE]

def echo(x):
    return x
"""


def helpers(value: int) -> str:
    return f"VALUE = {value}\n"


@pytest.fixture
async def worker(
    etcd_server: EtcdServer, unique_lane: Any, tmp_path: Path
) -> AsyncIterator[tuple[WorkerProcess, worker_v1.WorkerServiceStub, Path]]:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "main.py").write_text(MAIN)
    (functions / "helpers.py").write_text(helpers(1))
    proc = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
            "FUNCTIONS_POLL_INTERVAL_MS": "50",
        },
        tmp_path / "worker.log",
    )
    async with serving(proc) as (stub,):
        yield proc, stub, functions


def outputs(update: worker_v1.TaskUpdate) -> Any:
    result = execute_result(update)
    assert update.state == worker_v1.TaskState.SUCCEEDED, update
    return json.loads(result.plugin_results[0].result)


async def test_a_module_imports_its_sibling_of_the_current_epoch(
    worker: tuple[WorkerProcess, worker_v1.WorkerServiceStub, Path],
) -> None:
    _, stub, functions = worker
    first = await run_to_end(stub, call_list_task("imports-1", "value", [[0]]))
    assert outputs(first) == [[0, 1, 1]]
    (functions / "helpers.py").write_text(helpers(2))
    runs = iter(range(2, 1000))

    async def sees_the_new_helper() -> bool:
        update = await run_to_end(stub, call_list_task(f"imports-{next(runs)}", "value", [[0]]))
        return bool(outputs(update) == [[0, 2, 2]])

    await wait_until(sees_the_new_helper, "a task of the new epoch", timeout=20)


async def test_a_resubmission_with_another_input_is_flagged(
    worker: tuple[WorkerProcess, worker_v1.WorkerServiceStub, Path],
) -> None:
    proc, stub, _ = worker
    first = await run_to_end(stub, call_list_task("resubmitted", "echo", [["a"]]))
    assert outputs(first) == ["a"]

    same = await stub.submit_task(
        worker_v1.SubmitTaskRequest(task=call_list_task("resubmitted", "echo", [["a"]]))
    )
    assert same.input_differs is False
    changed = await stub.submit_task(
        worker_v1.SubmitTaskRequest(task=call_list_task("resubmitted", "echo", [["b"]]))
    )
    # Still the stable state of the task that ran, now flagged.
    assert changed.input_differs is True
    assert changed.state == worker_v1.TaskState.SUCCEEDED
    assert changed.result is not None
    assert changed.result.execute_result is not None
    assert json.loads(changed.result.execute_result.plugin_results[0].result) == ["a"]

    # The SDK: run raises with the earlier answer; place returns it flagged.
    async with Client() as client:
        edited = Task.call_list("echo", [["b"]], task_id="resubmitted")
        with pytest.raises(TaskInputDiffersError) as raised:
            await client.run(edited, worker_addr=proc.addr)
        answer = raised.value.answer
        assert answer.state is TaskState.SUCCEEDED
        assert answer.result is not None
        assert answer.result.outputs() == ["a"]
        assert "submit the changed task under a new task_id" in raised.value.message
        placed = await client.place(edited, worker_addr=proc.addr)
        assert placed.input_differs is True
        unchanged = Task.call_list("echo", [["a"]], task_id="resubmitted")
        assert (await client.run(unchanged, worker_addr=proc.addr)).outputs() == ["a"]

    # The CLI: a warning on stderr, then the earlier task's result.
    def submit(*calls: str) -> Any:
        args = ["submit", "--worker", proc.addr, "--task-id", "resubmitted", "--function", "echo"]
        for call in calls:
            args += ["--call", call]
        return CliRunner().invoke(app, [*args, "--wait"], catch_exceptions=False)

    warned = await asyncio.to_thread(submit, '["b"]')
    assert warned.exit_code == 0, warned.output
    assert "warning: task resubmitted already ran on" in warned.stderr
    assert "Submit the changed task under a new task_id" in warned.stderr
    assert '["a"]' in warned.stdout
    quiet = await asyncio.to_thread(submit, '["a"]')
    assert quiet.exit_code == 0, quiet.output
    assert "warning" not in quiet.stderr
