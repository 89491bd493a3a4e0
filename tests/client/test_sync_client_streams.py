"""SyncClient against a real coordinator, worker, sync invoker and etcd: its
iterators hand each update and each result over as it arrives, and typed values
come back converted.

A gated function holds a task RUNNING until the test opens its gate (a file), so
"arrived before the task ended" is an order the test controls, not a timing. A
safety opener opens every gate after a while, so a client that collects
everything before returning fails these tests instead of hanging them."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from processes import EXAMPLES, CoordinatorProcess, SyncInvokerProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import ConnectError, ResultTypeError, SyncClient, Task, TaskState
from blockx_server.etcd.local import EtcdServer

GATE = """
def gated(path):
    import os
    import time
    while not os.path.exists(path):
        time.sleep(0.01)
    return path
"""

# Long enough for any streaming client to have handed the first item over.
SAFETY_OPEN_S = 60.0


class Gate:
    """A file the gated function waits for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._timer = threading.Timer(SAFETY_OPEN_S, self.open)
        self._timer.daemon = True
        self._timer.start()

    @property
    def is_open(self) -> bool:
        return self.path.exists()

    def open(self) -> None:
        self.path.touch()
        self._timer.cancel()


class Stack:
    def __init__(self, root: Path, etcd: EtcdServer) -> None:
        self.root = root
        functions = root / "functions"
        functions.mkdir()
        shutil.copy(EXAMPLES / "functions" / "hello.py", functions / "hello.py")
        (functions / "gate.py").write_text(GATE)
        prefix = "/blockx/test/lanes/syncstreams/workers/"
        self.worker = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd.endpoint,
                "WORKER_REGISTRY_PREFIX": prefix,
                "WORKER_HEARTBEAT_INTERVAL": "100",
                "FUNCTIONS_DIR": str(functions),
            },
            root / "worker.log",
        )
        self.coordinator = CoordinatorProcess(
            {"ETCD_ENDPOINTS": etcd.endpoint, "COORDINATOR_REGISTRY_PREFIXES": prefix},
            root / "coordinator.log",
        )
        self.invoker = SyncInvokerProcess(
            {"FUNCTIONS_DIR": str(functions), "EXECUTOR_COUNT": "1"}, root / "invoker.log"
        )
        self._gates = 0
        # Executors may run as another user (nobody): the gates lie where it can look.
        self.gates = Path(tempfile.mkdtemp(prefix="blockx-gates-"))
        self.gates.chmod(0o755)

    def gate(self) -> Gate:
        self._gates += 1
        return Gate(self.gates / f"gate-{self._gates}")

    def client(self) -> SyncClient:
        return SyncClient(
            coordinator=f"127.0.0.1:{self.coordinator.port}",
            sync_invoker=f"127.0.0.1:{self.invoker.port}",
        )

    def stop(self) -> None:
        for process in (self.worker, self.coordinator, self.invoker):
            process.stop()
        shutil.rmtree(self.gates, ignore_errors=True)


def _sees_the_worker(coordinator: CoordinatorProcess) -> bool:
    try:
        return 'blockx_coordinator_registry_workers{format="v2"} 1.0' in coordinator.metrics()
    except OSError:
        return False


@pytest.fixture(scope="module")
def stack(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("syncstreams"), etcd_server)
    try:
        asyncio.run(s.worker.wait_ready())
        asyncio.run(s.invoker.wait_ready())
        asyncio.run(
            wait_until(
                lambda: _sees_the_worker(s.coordinator), "the coordinator's view", timeout=30
            )
        )
        yield s
    finally:
        s.stop()


def gated(gate: Gate, task_id: str) -> Task:
    return Task.call_list("gated", [[str(gate.path)]], task_id=task_id)


def test_watch_tasks_yields_each_update_as_the_worker_sends_it(stack: Stack) -> None:
    gate = stack.gate()
    with stack.client() as client:
        slot = client.reserve_worker_slot("sync-watch-gated")
        client.submit_task(
            gated(gate, slot.task_id), worker_addr=slot.worker_addr, slot_id=slot.slot_id
        )
        updates = client.watch_tasks([slot.task_id], worker_addr=slot.worker_addr)
        first = next(updates)
        # The snapshot came while the task still waits at its gate.
        assert not gate.is_open
        assert (first.state, first.is_terminal) == (TaskState.RUNNING, False)
        gate.open()
        rest = list(updates)
    assert [u.state for u in rest] == [TaskState.SUCCEEDED]
    assert rest[-1].result is not None
    assert rest[-1].result.outputs(list[str]) == [str(gate.path)]


def test_run_many_yields_each_result_as_its_task_finishes(stack: Stack) -> None:
    gate = stack.gate()
    tasks = [
        gated(gate, "sync-many-gated"),
        Task.call_list("hello_world", [["quick"]], task_id="sync-many-quick"),
    ]
    with stack.client() as client:
        results = client.run_many(tasks, concurrency=2)
        first = next(results)
        # The quick task's result is here while the gated one still runs.
        assert not gate.is_open
        assert (first.task_id, first.outputs(list[str])) == ("sync-many-quick", ["hello, quick"])
        gate.open()
        second = next(results)
        assert second.task_id == "sync-many-gated"
        assert second.ok
        assert list(results) == []


def test_stopping_early_closes_the_stream_and_the_client_goes_on(stack: Stack) -> None:
    gate = stack.gate()
    with stack.client() as client:
        slot = client.reserve_worker_slot("sync-watch-early")
        client.submit_task(
            gated(gate, slot.task_id), worker_addr=slot.worker_addr, slot_id=slot.slot_id
        )
        for update in client.watch_tasks([slot.task_id], worker_addr=slot.worker_addr):
            assert update.state is TaskState.RUNNING
            break  # closes the Watch stream on the client's loop
        assert not gate.is_open
        result = client.run(Task.call_list("hello_world", [["after"]]))
        assert result.outputs() == ["hello, after"]
        gate.open()
        done = client.run(gated(gate, slot.task_id))  # the same task_id: its result
        assert done.ok


def test_an_error_on_the_stream_is_raised_in_the_callers_thread(stack: Stack) -> None:
    with stack.client() as client:
        # A worker that is not there: the Watch stream cannot open.
        updates = client.watch_tasks(["t"], worker_addr=f"127.0.0.1:{free_port()}")
        with pytest.raises(ConnectError, match="the Watch stream to"):
            list(updates)


class Greeting(msgspec.Struct):
    greeting: str


def test_typed_values_are_converted_or_refused(stack: Stack) -> None:
    with stack.client() as client:
        hello = client.function("hello_world")
        assert hello.call("typed") == "hello, typed"  # the untyped form, as before
        text: str = hello.call("typed", result_type=str)
        assert text == "hello, typed"
        with pytest.raises(ResultTypeError, match="the value of hello_world is not a int") as info:
            hello.call("typed", result_type=int)
        assert info.value.value == "hello, typed"
        result = client.run(Task.call_list("hello_world", [["a"], ["b"]]))
        outputs: list[str] = result.outputs(list[str])
        assert outputs == ["hello, a", "hello, b"]
        with pytest.raises(ResultTypeError, match=f"outputs of task {result.task_id}"):
            result.outputs(list[Greeting])
