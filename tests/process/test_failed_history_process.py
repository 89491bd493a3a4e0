"""Failed tasks outlive their results, with a real ``blockx-worker`` whose results
are kept 200 ms (RESULT_RETENTION_MS), registered in a real etcd, and
``blockx tasks`` run as a subprocess.

After retention the result is gone as the specification says (GetTaskResult
NOT_FOUND, the task id runs again), and the failure is still listed, marked
expired, by ``blockx tasks --state failed``, ListTasks with include_expired and
DescribeWorker's recent failures; a listing that does not ask for expired
failures is what it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from processes import WorkerProcess, call_list_task, execute_result, run_to_end
from support import wait_until

from blockx_client import Client, TaskFilter, TaskState
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

PREFIX = "/blockx/workers/"
FAILED_ID = "history-fail"


FUNCTIONS = """
def echo(x):
    return x


def boom(x):
    raise ValueError(f"boom {x}")
"""


@dataclass
class Cluster:
    etcd_endpoint: str
    worker: WorkerProcess


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    base = tmp_path_factory.mktemp("failed-history")
    functions = base / "functions"
    functions.mkdir()
    (functions / "historyfns.py").write_text(FUNCTIONS)
    async with EtcdServer() as etcd:
        process = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd.endpoint,
                "WORKER_REGISTRY_PREFIX": PREFIX,
                "WORKER_HEARTBEAT_INTERVAL": "100",
                "FUNCTIONS_DIR": str(functions),
                "EXECUTOR_COUNT": "1",
                "RESULT_RETENTION_MS": "200",
            },
            base / "worker.log",
        )
        try:
            await process.wait_ready()
            yield Cluster(etcd.endpoint, process)
        finally:
            assert process.stop() == 0
            assert "Traceback" not in process.output()


def blockx(etcd_endpoints: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx")
    assert binary is not None
    env = {**os.environ, "ETCD_ENDPOINTS": etcd_endpoints, "COLUMNS": "250"}
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


async def test_a_failure_outlives_its_result(cluster: Cluster) -> None:
    worker = cluster.worker
    channel = worker.channel()
    stub = worker_v1.WorkerServiceStub(channel)
    try:
        # Watched from its reservation: the terminal update cannot miss the short retention.
        reserved = await stub.request_task_slot(
            worker_v1.RequestTaskSlotRequest(task_id=FAILED_ID, ttl_ms=30_000)
        )
        updates = stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=[FAILED_ID]))
        snapshot = await anext(updates)
        assert snapshot.state == worker_v1.TaskState.ALLOCATED
        await stub.submit_task(
            worker_v1.SubmitTaskRequest(
                task=call_list_task(FAILED_ID, "boom", [["x"]]), slot_id=reserved.slot_id
            )
        )
        final = await anext(updates)
        assert execute_result(final).failure_code == "CALL_FAILED"

        async def result_expired() -> bool:
            try:
                await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id=FAILED_ID))
            except GRPCError as exc:
                return exc.status == Status.NOT_FOUND
            return False

        await wait_until(result_expired, "the failed task's result to expire", timeout=30)

        as_json = await asyncio.to_thread(
            blockx, cluster.etcd_endpoint, "tasks", "--state", "failed", "--json"
        )
        assert as_json.returncode == 0, as_json.stderr
        [listed] = json.loads(as_json.stdout)["tasks"]
        assert (listed["task_id"], listed["state"], listed["expired"]) == (
            FAILED_ID,
            "FAILED",
            True,
        )
        assert listed["failure_code"] == "CALL_FAILED"
        assert listed["function"] == "boom"
        assert listed["converged_ms"] >= listed["created_ms"] > 0

        # The id runs again, as the specification allows once the result is gone.
        update = await run_to_end(stub, call_list_task(FAILED_ID, "echo", [["again"]]))
        assert update.state == worker_v1.TaskState.SUCCEEDED

        async with Client(direct=True) as client:
            held = await client.list_tasks(workers=[worker.addr])
            history = await client.list_tasks(
                TaskFilter(states=(TaskState.FAILED,), include_expired=True), workers=[worker.addr]
            )
            described = await client.describe_worker(worker.addr)
        # Without include_expired the listing is what the Worker holds, as before.
        assert [(t.task_id, t.state, t.expired) for t in held.tasks] == [
            (FAILED_ID, TaskState.SUCCEEDED, False)
        ]
        assert [(t.task_id, t.state, t.expired) for t in history.tasks] == [
            (FAILED_ID, TaskState.FAILED, True)
        ]
        [failure] = described.recent_failures
        assert (failure.task_id, failure.expired) == (FAILED_ID, True)
        assert (described.failed_tasks_kept, described.result_retention_ms) == (1_000, 200)
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [("recent_failures", -1), ("recent_failures", 1_001), ("running_tasks", -5)],
)
async def test_describe_worker_refuses_counts_out_of_bounds(
    cluster: Cluster, field: str, value: int
) -> None:
    channel = cluster.worker.channel()
    try:
        stub = worker_v1.WorkerServiceStub(channel)
        with pytest.raises(GRPCError) as refused:
            await stub.describe_worker(worker_v1.DescribeWorkerRequest(**{field: value}))
        assert refused.value.status == Status.INVALID_ARGUMENT
        assert refused.value.message == (
            f"{field} must be 0 (the default, {20 if field == 'recent_failures' else 100}) "
            f"to 1000 (got {value})"
        )
    finally:
        channel.close()
