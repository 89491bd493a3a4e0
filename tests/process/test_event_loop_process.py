"""BLOCKX_EVENT_LOOP: a Coordinator and a Worker on uvloop serve a task from the SDK
end to end; an unknown loop is one line at start-up naming the variable."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess, serving
from support import wait_until

from blockx_client import Client, Task, TaskState
from blockx_server.etcd.local import EtcdServer

pytest.importorskip("uvloop")  # a dev dependency; optional for users


def runs_uvloop(pid: int) -> bool:
    """Whether uvloop's extension is mapped into the process (its loop is in use)."""
    return "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


async def test_a_task_runs_with_coordinator_and_worker_on_uvloop(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    prefix = unique_lane()
    on_uvloop = {"BLOCKX_EVENT_LOOP": "uvloop", "ETCD_ENDPOINTS": etcd_server.endpoint}
    worker = WorkerProcess(
        {
            **on_uvloop,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        },
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {**on_uvloop, "COORDINATOR_REGISTRY_PREFIXES": prefix}, tmp_path / "coordinator.log"
    )
    try:
        async with serving(worker):
            await coordinator.wait_serving()
            assert runs_uvloop(worker.proc.pid)
            assert runs_uvloop(coordinator.proc.pid)

            async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:

                async def placed() -> bool:
                    result = await client.run(Task.call_list("hello_world", [["uvloop"]]))
                    return result.state is TaskState.SUCCEEDED

                await wait_until(placed, "a task through the coordinator", timeout=30)
                result = await client.run(Task.call_list("hello_world", [["a"], ["b"]]))
                assert result.outputs() == ["hello, a", "hello, b"]
    finally:
        assert coordinator.stop() == 0
    assert "Traceback" not in coordinator.output()


@pytest.mark.parametrize("program", ["blockx-worker", "blockx-coordinator"])
def test_an_unknown_event_loop_is_one_line_naming_the_variable(program: str) -> None:
    binary = shutil.which(program)
    assert binary is not None
    env = {
        **os.environ,
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        "BLOCKX_EVENT_LOOP": "tokio",
    }
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "BLOCKX_EVENT_LOOP" in line
    assert "asyncio, uvloop" in line
