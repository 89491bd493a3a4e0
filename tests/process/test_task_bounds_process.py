"""A Worker's bounds on one task and on what it keeps, against real Worker processes.

* TASK_MAX_CALLS: a task of more calls fails BUILDER_FAILED (not retryable) naming
  it; a config of ten million calls is refused without building them, parsed on a
  thread while the Worker goes on answering grpc.health.v1.
* RESULT_RETENTION_MAX_BYTES: retained results stay within it, the oldest leave
  a tombstone; GetTaskResult of one says its outputs were dropped, and
  resubmitting its task id answers the same state without running it again.
* Bad values of the three settings refuse start-up with one line naming each.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grpclib.health.v1.health_pb2 import HealthCheckResponse
from processes import EXAMPLES, WorkerProcess, execute_result, run_to_end, serving
from support import free_port

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def echo(x):
    return x

def big(n):
    return "x" * n
"""

# Room for the 40 MB SubmitTask below, should the Worker bound what it receives.
LARGE_MESSAGES = {"GRPC_MAX_RECEIVE_BYTES": str(64 * 1024 * 1024)}


def functions_dir(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    d.mkdir()
    (d / "bounds.py").write_text(FUNCTIONS)
    return d


def start_worker(
    etcd: EtcdServer, lane: Callable[..., str], tmp_path: Path, **env: str
) -> WorkerProcess:
    return WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": lane(),
            "FUNCTIONS_DIR": str(functions_dir(tmp_path)),
            **LARGE_MESSAGES,
            **env,
        },
        tmp_path / "worker.log",
    )


def task(task_id: str, builder: str, config: str | dict[str, Any]) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type=builder, config=config if isinstance(config, str) else json.dumps(config)
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


def metric(text: str, name: str, **labels: str) -> float:
    """The value of a sample of ``name`` with exactly ``labels`` in a Prometheus page."""
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    wanted = f"{name}{{{shown}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if _sorted_labels(sample) == wanted:
            return float(value)
    raise AssertionError(f"{wanted} not in the metrics page")


def _sorted_labels(sample: str) -> str:
    match = re.fullmatch(r"([^{]+)\{(.*)\}", sample)
    if match is None:
        return sample
    pairs = sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
    return match.group(1) + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


def memory_kb(worker: WorkerProcess, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of the Worker process, in kB."""
    status = Path(f"/proc/{worker.proc.pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB$", status, re.MULTILINE)
    assert match is not None, status
    return int(match.group(1))


async def test_a_task_over_task_max_calls_fails_builder_failed_naming_it(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    worker = start_worker(etcd_server, unique_lane, tmp_path, TASK_MAX_CALLS="5")
    async with serving(worker) as (stub,):
        calls = [[i] for i in range(5)]
        ok = await run_to_end(stub, task("at-limit", "CallListCallConfig", _listed(calls)))
        assert ok.state is worker_v1.TaskState.SUCCEEDED, ok
        assert json.loads(execute_result(ok).plugin_results[0].result) == list(range(5))
        for task_id, builder, config in [
            ("list-over", "CallListCallConfig", _listed([*calls, [5]])),
            ("inputs-over", "InputsCallConfig", {"function": "echo", "inputs": [{"x": 1}] * 6}),
        ]:
            final = await run_to_end(stub, task(task_id, builder, config))
            assert final.state is worker_v1.TaskState.FAILED, final
            result = execute_result(final)
            assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", False)
            assert f"{builder}: more than TASK_MAX_CALLS (5) calls" in result.failure_message


def _listed(calls: list[list[Any]]) -> dict[str, Any]:
    return {"function": "echo", "callList": calls}


async def test_ten_million_calls_are_refused_on_a_thread_while_health_is_answered(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    worker = start_worker(etcd_server, unique_lane, tmp_path)
    config = '{"function": "echo", "callList": [' + ",".join(["[1]"] * 10_000_000) + "]}"
    async with serving(worker) as (stub,):
        idle_kb = memory_kb(worker, "VmRSS")
        statuses: list[int] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                statuses.append(await worker.health())

        prober = asyncio.create_task(probe())
        try:
            final = await run_to_end(stub, task("ten-million", "CallListCallConfig", config))
        finally:
            stop.set()
            await prober
        assert final.state is worker_v1.TaskState.FAILED, final
        result = execute_result(final)
        assert (result.failure_code, result.retryable) == ("BUILDER_FAILED", False)
        assert "more than TASK_MAX_CALLS (1000000) calls" in result.failure_message
        assert statuses
        assert set(statuses) == {HealthCheckResponse.SERVING}
        # The JSON check and the Builder's count ran on the parse threads.
        page = worker.metrics()
        assert metric(page, "blockx_worker_offloaded_parses_total", step="submit") == 1
        assert metric(page, "blockx_worker_offloaded_parses_total", step="builder") == 1
        # Not one of the ten million calls was built: the peak is the 40 MB request
        # and its copies while it is received and decoded (about 330 MB here), far
        # from the gigabytes ten million calls take.
        assert memory_kb(worker, "VmHWM") - idle_kb < 700 * 1024


OUTPUT_BYTES = 5_000_000
BUDGET = 12_000_000  # two 5 MB results fit, a third does not


async def test_retained_results_stay_within_the_budget_and_tombstones_never_rerun(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    worker = start_worker(
        etcd_server, unique_lane, tmp_path, RESULT_RETENTION_MAX_BYTES=str(BUDGET)
    )
    ids = [f"big-{i}" for i in range(12)]
    config = {"function": "big", "callList": [[OUTPUT_BYTES]]}
    async with serving(worker) as (stub,):
        await run_to_end(stub, task("warm-up", "CallListCallConfig", config))
        warm_kb = memory_kb(worker, "VmRSS")
        for task_id in ids:
            final = await run_to_end(stub, task(task_id, "CallListCallConfig", config))
            assert final.state is worker_v1.TaskState.SUCCEEDED, final
            page = worker.metrics()
            assert metric(page, "blockx_worker_retained_result_bytes") <= BUDGET
        assert metric(page, "blockx_worker_retained_results") == 2
        assert metric(page, "blockx_worker_result_tombstones") == len(ids) + 1 - 2
        assert metric(page, "blockx_worker_results_dropped_total") == len(ids) + 1 - 2
        # Twelve 5 MB results went through; the Worker holds two of them.
        assert memory_kb(worker, "VmRSS") - warm_kb < len(ids) * OUTPUT_BYTES // 1024

        newest = await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id=ids[-1]))
        assert newest.result is not None
        assert newest.result.execute_result is not None
        kept = newest.result.execute_result.plugin_results[0].result
        assert json.loads(kept) == ["x" * OUTPUT_BYTES]

        oldest = await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id=ids[0]))
        assert oldest.state is worker_v1.TaskState.SUCCEEDED
        assert oldest.result is not None
        assert oldest.result.success
        dropped = oldest.result.execute_result
        assert dropped is not None
        assert "its outputs were dropped to keep retained results under " in (
            dropped.failure_message
        )
        assert "RESULT_RETENTION_MAX_BYTES" in dropped.failure_message
        assert [(p.plugin_name, p.success, p.result) for p in dropped.plugin_results] == [
            ("ReturnValueResultHandler", True, b"")
        ]

        succeeded = metric(
            worker.metrics(), "blockx_worker_tasks_total", state="SUCCEEDED", failure_code=""
        )
        again = await stub.submit_task(
            worker_v1.SubmitTaskRequest(task=task(ids[0], "CallListCallConfig", config))
        )
        assert again.state is worker_v1.TaskState.SUCCEEDED
        assert again.result == oldest.result
        watched = await run_to_end(stub, task(ids[0], "CallListCallConfig", config))
        assert watched.state is worker_v1.TaskState.SUCCEEDED
        after = metric(
            worker.metrics(), "blockx_worker_tasks_total", state="SUCCEEDED", failure_code=""
        )
        assert after == succeeded == len(ids) + 1  # the tombstoned task did not run again


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        ("TASK_MAX_CALLS", "0", "TASK_MAX_CALLS must be >= 1 (got 0)"),
        ("RESULT_RETENTION_MAX_BYTES", "-1", "RESULT_RETENTION_MAX_BYTES must be >= 1 (got -1)"),
        ("RESULT_TOMBSTONES_MAX", "many", "RESULT_TOMBSTONES_MAX must be an integer (got 'many')"),
    ],
)
def test_a_bad_bound_refuses_start_up_naming_it(variable: str, value: str, line: str) -> None:
    binary = shutil.which("blockx-worker")
    assert binary is not None
    result = subprocess.run(
        [binary],
        env={
            "PATH": "",
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
            "WORKER_LISTEN": f"127.0.0.1:{free_port()}",
            variable: value,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"blockx-worker: invalid configuration: {line}"]
