"""The metrics endpoint of real processes: per-function and per-Worker metrics after
real tasks, OpenMetrics negotiation, a request head far past any bound, and the
coordinator's reservations by outcome and reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from grpclib.const import Status
from processes import CoordinatorProcess, WorkerProcess
from support import children_of, wait_until

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
def echo(x):
    return x

def boom(x):
    raise ValueError(f"boom {x}")
"""

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def task(task_id: str, function: str, call_list: list[list[int]]) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps({"function": function, "callList": call_list}),
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


def get(url: str, accept: str | None = None, method: str = "GET") -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, method=method)
    if accept is not None:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def sample(text: str, series: str) -> float:
    """The value of one series (``name{labels}``, labels in the exposition's order)."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{series} not in:\n{text}"
    return float(match.group(1))


def executor_pids(parent: int) -> list[int]:
    pids = []
    for pid in children_of(parent):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"blockx_executor" in cmdline:
            pids.append(pid)
    return pids


@pytest.fixture
def lane(unique_lane: Callable[..., str]) -> str:
    return unique_lane()


@pytest.fixture
def worker(etcd_server: EtcdServer, lane: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "fns.py").write_text(FUNCTIONS)
    process = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": lane,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
        },
        tmp_path / "worker.log",
    )
    yield process
    process.stop()


async def test_per_function_and_worker_metrics_in_both_formats(worker: WorkerProcess) -> None:
    await worker.wait_ready()
    channel = worker.channel()
    try:
        stub = worker_v1.WorkerServiceStub(channel)
        await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("m-1", "echo", [[1], [2]])))
        await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("m-2", "echo", [[3]])))
        await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("m-3", "boom", [[1]])))
        async with asyncio.timeout(30):
            updates = [
                u
                async for u in stub.watch_tasks(
                    worker_v1.WatchTasksRequest(task_ids=["m-1", "m-2", "m-3"])
                )
            ]
        assert sum(u.is_terminal for u in updates) == 3
    finally:
        channel.close()

    url = f"http://{worker.host}:{worker.metrics_port}/metrics"
    status, content_type, body = await asyncio.to_thread(get, url)
    assert status == 200
    assert content_type.startswith("text/plain")
    text = body.decode()
    assert sample(text, 'blockx_function_calls_total{function="echo"}') == 3
    assert sample(text, 'blockx_function_calls_total{function="boom"}') == 1
    assert sample(text, 'blockx_function_failures_total{function="boom",kind="USER_ERROR"}') == 1
    assert 'blockx_function_failures_total{function="echo"' not in text
    assert sample(text, 'blockx_function_calls_phase_duration_seconds_count{function="echo"}') == 2
    assert sample(text, 'blockx_function_cpu_seconds_total{function="echo"}') > 0
    assert sample(text, 'blockx_function_io_seconds_total{function="echo"}') >= 0
    assert sample(text, 'blockx_function_executor_seconds_total{function="echo"}') >= 0
    assert sample(text, 'blockx_worker_tasks_total{failure_code="",state="SUCCEEDED"}') == 2
    assert sample(text, 'blockx_worker_slots{state="running"}') == 0
    assert sample(text, "blockx_worker_code_epoch") == 1
    assert sample(text, "blockx_worker_executor_restarts_total") == 0
    assert sample(text, "process_resident_memory_bytes") > 0
    assert sample(text, "process_cpu_seconds_total") > 0

    status, content_type, body = await asyncio.to_thread(get, url, OPENMETRICS)
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    open_text = body.decode()
    assert open_text.endswith("# EOF\n")
    assert sample(open_text, 'blockx_function_calls_total{function="echo"}') == 3

    # An executor killed from outside is started again, and counted.
    victim = executor_pids(worker.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)

    async def restarted() -> bool:
        _, _, body = await asyncio.to_thread(get, url)
        return sample(body.decode(), "blockx_worker_executor_restarts_total") == 1

    await wait_until(restarted, "the executor restart to be counted", timeout=20)


def raw_request(port: int, head: bytes) -> bytes:
    """Send ``head`` and read whatever comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # The server may answer and close before it has read it all.
        with contextlib.suppress(OSError):
            sock.sendall(head)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


async def test_the_endpoint_survives_a_huge_request_head_and_answers_only_its_path(
    worker: WorkerProcess,
) -> None:
    await worker.wait_ready()
    port = worker.metrics_port
    filler = b"x" * (100 * 1024)
    one_long_header = b"GET /metrics HTTP/1.1\r\nHost: a\r\nX-Filler: " + filler + b"\r\n\r\n"
    many_headers = b"GET /metrics HTTP/1.1\r\n" + b"".join(
        b"X-%d: %s\r\n" % (i, b"y" * 1000) for i in range(100)
    )
    long_request_line = b"GET /metrics?" + filler + b" HTTP/1.1\r\nHost: a\r\n\r\n"
    for head in (one_long_header, many_headers + b"\r\n", long_request_line):
        answer = await asyncio.to_thread(raw_request, port, head)
        assert answer.split(b"\r\n", 1)[0] in (
            b"HTTP/1.0 414 Request-URI Too Long",
            b"HTTP/1.0 431 Line too long",
            b"HTTP/1.0 431 Too many headers",
        ), answer[:200]
        worker.assert_alive()
        status, _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert b"blockx_worker_ready 1.0" in body

    status, _, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/other")
    assert status == 404
    status, _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics", None, "HEAD")
    assert (status, body) == (200, b"")
    assert worker.stop() == 0
    assert "Traceback" not in worker.output()


async def test_coordinator_counts_reservations_by_outcome_and_reason(
    worker: WorkerProcess,
    lane: str,
    unique_lane: Callable[..., str],
    etcd_server: EtcdServer,
    tmp_path: Path,
) -> None:
    await worker.wait_ready()
    coordinator = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd_server.endpoint, "COORDINATOR_REGISTRY_PREFIXES": lane},
        tmp_path / "coordinator.log",
    )
    empty = CoordinatorProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "COORDINATOR_REGISTRY_PREFIXES": unique_lane(),  # no worker there
        },
        tmp_path / "coordinator-empty.log",
    )
    try:
        await coordinator.wait_serving()
        await empty.wait_serving()

        async def routed() -> bool:
            return await coordinator.status_of("r-1") is Status.OK

        await wait_until(routed, "the coordinator routing to the worker", timeout=20)
        assert await empty.status_of("r-2") is not Status.OK

        text = await asyncio.to_thread(coordinator.metrics)
        granted = 'blockx_coordinator_reservations_total{outcome="reserved",reason="granted"}'
        assert sample(text, granted) >= 1
        assert sample(text, 'blockx_coordinator_reserve_total{outcome="reserved"}') >= 1
        empty_text = await asyncio.to_thread(empty.metrics)
        assert re.search(
            r"^blockx_coordinator_reservations_total"
            r'\{outcome="[a-z_]+",reason="none_tried"\} [1-9]',
            empty_text,
            re.MULTILINE,
        ), empty_text
    finally:
        assert coordinator.stop() == 0
        assert empty.stop() == 0
