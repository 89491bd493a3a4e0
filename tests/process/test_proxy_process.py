"""The real ``blockx-proxy`` console script in front of the real ``blockx-coordinator``
and ``blockx-worker`` (with its executors) and the session etcd: one task's whole
path through the Unix socket, bad configuration, and shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from processes import ConsoleProcess, CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_core.addr import WORKER_ADDR_HEADER
from blockx_proto import coordinator_v1, syncinvoker_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.proxy.allowed import NOT_A_WORKER


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of a Unix socket path.
    path = Path(tempfile.mkdtemp(prefix="bxp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class ProxyProcess(ConsoleProcess):
    def __init__(self, socket_path: Path, env: dict[str, str], log: Path) -> None:
        self.socket_path = socket_path
        super().__init__("blockx-proxy", {"PROXY_SOCKET_PATH": str(socket_path), **env}, log)

    async def wait_serving(self) -> None:
        """Until a call through the socket gets any gRPC answer."""

        async def answers() -> bool:
            self.assert_alive()
            async with Channel(path=str(self.socket_path)) as channel:
                try:
                    await coordinator_v1.CoordinatorServiceStub(channel).reserve_worker_slot(
                        coordinator_v1.ReserveWorkerSlotRequest(task_id="probe"), timeout=5
                    )
                except GRPCError:
                    return True
                except OSError:
                    return False
            return True

        await wait_until(answers, "blockx-proxy serving", timeout=20)


@pytest.fixture
def start_proxy(socket_dir: Path, tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    started: list[ProxyProcess] = []

    def start(name: str = "p.sock", **env: str) -> ProxyProcess:
        # Upstreams default to closed ports, never to whatever listens on the defaults.
        env = {
            "PROXY_COORDINATOR_ADDR": f"127.0.0.1:{free_port()}",
            "PROXY_SYNC_INVOKER_ADDR": f"127.0.0.1:{free_port()}",
            **env,
        }
        proxy = ProxyProcess(socket_dir / name, env, tmp_path / f"proxy-{len(started)}.log")
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def lane(unique_lane: Callable[..., str]) -> str:
    """The cluster's registry prefix, which the proxy watches too."""
    return unique_lane()


def registry_env(etcd_server: EtcdServer, lane: str) -> dict[str, str]:
    """What a proxy needs to forward to the cluster's Workers."""
    return {"ETCD_ENDPOINTS": etcd_server.endpoint, "PROXY_REGISTRY_PREFIXES": lane}


@pytest.fixture
def cluster(
    etcd_server: EtcdServer, lane: str, tmp_path: Path
) -> Iterator[tuple[CoordinatorProcess, WorkerProcess]]:
    prefix = lane
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
        },
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd_server.endpoint, "COORDINATOR_REGISTRY_PREFIXES": prefix},
        tmp_path / "coordinator.log",
    )
    yield coordinator, worker
    coordinator.stop()
    worker.stop()


@pytest.fixture
async def proxy_channel() -> AsyncIterator[Callable[[ProxyProcess], Channel]]:
    opened: list[Channel] = []

    def open_channel(proxy: ProxyProcess) -> Channel:
        channel = Channel(path=str(proxy.socket_path))
        opened.append(channel)
        return channel

    yield open_channel
    for channel in opened:
        channel.close()


def hello_task(task_id: str) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps({"function": "hello_world", "callList": [["ct2"], ["blockx"]]}),
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
        task_timeout_ms=30_000,
    )


async def test_a_task_runs_end_to_end_through_the_proxy(
    cluster: tuple[CoordinatorProcess, WorkerProcess],
    start_proxy: Callable[..., ProxyProcess],
    proxy_channel: Callable[[ProxyProcess], Channel],
    etcd_server: EtcdServer,
    lane: str,
) -> None:
    coordinator, worker = cluster
    # The sync invoker is not running: its address only has to be well formed.
    sync_invoker = f"127.0.0.1:{free_port()}"
    proxy = start_proxy(
        PROXY_COORDINATOR_ADDR=f"127.0.0.1:{coordinator.port}",
        PROXY_SYNC_INVOKER_ADDR=sync_invoker,
        **registry_env(etcd_server, lane),
    )
    await worker.wait_ready()
    await proxy.wait_serving()
    channel = proxy_channel(proxy)
    coordinators = coordinator_v1.CoordinatorServiceStub(channel)
    workers = worker_v1.WorkerServiceStub(channel)
    task = hello_task("t-proxy-e2e")

    async def reserved() -> bool:
        try:
            await coordinators.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id=task.task_id), timeout=10
            )
        except GRPCError:
            return False
        return True

    await wait_until(reserved, "a reservation through the proxy", timeout=30)
    # Idempotent for a task_id: the same worker and slot again.
    reservation = await coordinators.reserve_worker_slot(
        coordinator_v1.ReserveWorkerSlotRequest(task_id=task.task_id), timeout=10
    )
    assert reservation.worker_addr == worker.addr
    at_worker = {WORKER_ADDR_HEADER: reservation.worker_addr}

    submitted = await workers.submit_task(
        worker_v1.SubmitTaskRequest(task=task, slot_id=reservation.slot_id),
        metadata=at_worker,
        timeout=10,
    )
    assert submitted.state is worker_v1.TaskState.RUNNING
    updates = [
        update
        async for update in workers.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=[task.task_id]), metadata=at_worker, timeout=30
        )
    ]
    final = updates[-1]
    assert final.is_terminal
    assert final.state is worker_v1.TaskState.SUCCEEDED
    assert final.worker_addr == worker.addr
    got = await workers.get_task_result(
        worker_v1.GetTaskResultRequest(task_id=task.task_id), metadata=at_worker, timeout=10
    )
    assert got.state is worker_v1.TaskState.SUCCEEDED
    assert got.result is not None
    assert got.result.execute_result is not None
    [plugin] = got.result.execute_result.plugin_results
    assert plugin.plugin_name == "ReturnValueResultHandler"
    assert json.loads(plugin.result) == ["hello, ct2", "hello, blockx"]
    assert got.result == final.result

    # The real worker's errors come back as they are.
    with pytest.raises(GRPCError) as err:
        await workers.get_task_result(
            worker_v1.GetTaskResultRequest(task_id="never-submitted"),
            metadata=at_worker,
            timeout=10,
        )
    assert err.value.status is Status.NOT_FOUND
    # GetCallRecord too, with the Worker's words.
    with pytest.raises(GRPCError) as err:
        await workers.get_call_record(
            worker_v1.GetCallRecordRequest(task_id=task.task_id), metadata=at_worker, timeout=10
        )
    assert err.value.status is Status.NOT_FOUND
    assert err.value.message == (
        "task 't-proxy-e2e' succeeded: only the calls that fail a task are recorded"
    )
    # And the proxy's own: no header, an unreachable sync invoker.
    with pytest.raises(GRPCError) as err:
        await workers.get_task_result(
            worker_v1.GetTaskResultRequest(task_id=task.task_id), timeout=10
        )
    assert err.value.status is Status.INVALID_ARGUMENT
    with pytest.raises(GRPCError) as err:
        await syncinvoker_v1.SyncInvokerServiceStub(channel).invoke(
            syncinvoker_v1.InvokeRequest(function="hello_world", args='["x"]'), timeout=10
        )
    assert err.value.status is Status.UNAVAILABLE
    assert sync_invoker in (err.value.message or "")
    proxy.assert_alive()


async def test_the_proxy_forwards_only_to_registered_workers(
    cluster: tuple[CoordinatorProcess, WorkerProcess],
    start_proxy: Callable[..., ProxyProcess],
    proxy_channel: Callable[[ProxyProcess], Channel],
    etcd_server: EtcdServer,
    lane: str,
) -> None:
    _, worker = cluster
    proxy = start_proxy(**registry_env(etcd_server, lane))
    await worker.wait_ready()
    await proxy.wait_serving()
    workers = worker_v1.WorkerServiceStub(proxy_channel(proxy))

    async def answer(addr: str) -> tuple[Status, str | None]:
        with pytest.raises(GRPCError) as err:
            await workers.get_task_result(
                worker_v1.GetTaskResultRequest(task_id="never-submitted"),
                metadata={WORKER_ADDR_HEADER: addr},
                timeout=10,
            )
        return err.value.status, err.value.message

    async def reachable() -> bool:
        return (await answer(worker.addr))[0] is Status.NOT_FOUND

    # The registered Worker answers itself (it does not know the task).
    await wait_until(reachable, "the registered worker through the proxy", timeout=30)

    # An open port that is no Worker: it must not even see a connection.
    connections: list[int] = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    listener = await asyncio.start_server(count, "127.0.0.1", 0)
    open_port = listener.sockets[0].getsockname()[1]
    try:
        answers = {
            "etcd": await answer(etcd_server.endpoint),
            "open": await answer(f"127.0.0.1:{open_port}"),
            "closed": await answer(f"127.0.0.1:{free_port()}"),
            "the worker by another name": await answer(f"localhost:{worker.port}"),
        }
    finally:
        listener.close()
        await listener.wait_closed()
    assert set(answers.values()) == {(Status.PERMISSION_DENIED, NOT_A_WORKER)}, answers
    assert connections == []
    proxy.assert_alive()


def _path_taken(path: Path) -> bool:
    return os.path.lexists(path)


def _run_proxy(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx-proxy")
    assert binary is not None, "blockx-proxy is not installed (uv sync)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    return subprocess.run(
        [binary], env={**clean, **env}, capture_output=True, text=True, timeout=30
    )


def _assert_one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("blockx-proxy: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PROXY_SOCKET_PATH", ""),
        ("PROXY_SOCKET_PATH", "/nonexistent-dir-for-blockx/p.sock"),
        ("PROXY_SOCKET_PATH", "/tmp/" + "x" * 120),
        ("PROXY_COORDINATOR_ADDR", "coordinator"),
        ("PROXY_BUNDLE_COORDINATOR_ADDR", "127.0.0.1:http"),
        ("PROXY_SYNC_INVOKER_ADDR", "::1:9091"),
        ("PROXY_MAX_UPSTREAMS", "0"),
        ("PROXY_MAX_STREAMS_PER_CONNECTION", "-1"),
        ("PROXY_CONNECT_TIMEOUT_MS", "soon"),
        ("PROXY_ALLOWED_WORKERS", "127.0.0.1:7001,worker"),
        ("PROXY_REGISTRY_PREFIXES", "/blockx/workers"),
        ("ETCD_PASSWORD", "without-tls"),
        ("BLOCKX_LOG_LEVEL", "LOUD"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    socket_dir: Path, variable: str, value: str
) -> None:
    env = {"PROXY_SOCKET_PATH": str(socket_dir / "p.sock"), variable: value}
    _assert_one_line(_run_proxy(env), variable)


def test_a_path_that_is_not_a_socket_is_refused_and_kept(socket_dir: Path) -> None:
    regular = socket_dir / "notes.txt"
    regular.write_text("keep me")
    _assert_one_line(_run_proxy({"PROXY_SOCKET_PATH": str(regular)}), "PROXY_SOCKET_PATH")
    assert regular.read_text() == "keep me"


async def test_sigterm_exits_0_and_removes_the_socket(
    socket_dir: Path, start_proxy: Callable[..., ProxyProcess]
) -> None:
    # What a killed proxy leaves behind: a socket file nobody listens on.
    stale = socket_dir / "p.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stale))
    proxy = start_proxy()
    await proxy.wait_serving()
    # A second proxy must not take a live socket over.
    second = _run_proxy({"PROXY_SOCKET_PATH": str(stale)})
    _assert_one_line(second, "PROXY_SOCKET_PATH", "in use")
    proxy.assert_alive()
    assert proxy.stop() == 0  # SIGTERM
    assert not _path_taken(stale)
    output = proxy.output()
    assert "Traceback" not in output
    assert "shutting down" in output
