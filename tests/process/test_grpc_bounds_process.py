"""What a client can make a BlockX gRPC server hold: request size, streams, idle and
half-open connections, and responses a client never reads.

The Worker runs as a real process (real etcd, real sockets); the tests talk to it
with grpclib and with raw sockets driven by h2. The never-reading client runs
against an in-process ``BoundedServer`` so that the server's own buffers can be
measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_pb2 import HealthCheckResponse
from grpclib.protocol import H2Protocol
from h2.settings import SettingCodes
from processes import (
    EXAMPLES,
    WorkerProcess,
    call_list_task,
    execute_result,
    run_to_end,
    serving,
)

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.connection_limits import MIB, GrpcLimits
from blockx_server.runtime.serving import bounded_server

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[StartWorker]:
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        worker = WorkerProcess(
            {"ETCD_ENDPOINTS": etcd_server.endpoint, **env},
            tmp_path / f"worker-{len(started)}.log",
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


SERVER_PROGRAMS = [
    "blockx-coordinator",
    "blockx-bundle-coordinator",
    "blockx-worker",
    "blockx-bundle-worker",
    "blockx-syncinvoker",
    "blockx-proxy",
]


@pytest.mark.parametrize("program", SERVER_PROGRAMS)
def test_every_server_program_reads_the_limits_and_refuses_bad_ones(
    program: str, tmp_path: Path
) -> None:
    binary = shutil.which(program)
    assert binary is not None, f"{program} is not installed (uv sync)"
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    for variable in ("GRPC_MAX_RECEIVE_BYTES", "GRPC_IDLE_TIMEOUT_MS", "GRPC_HANDSHAKE_TIMEOUT_MS"):
        assert f"  {variable} (default: " in help_text.stdout
    bad = {
        "GRPC_MAX_RECEIVE_BYTES": "100",
        "GRPC_IDLE_TIMEOUT_MS": "0",
        "GRPC_HANDSHAKE_TIMEOUT_MS": "soon",
        "PROXY_SOCKET_PATH": str(tmp_path / "proxy.sock"),
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
    }
    started = subprocess.run(
        [binary], env={**os.environ, **bad}, capture_output=True, text=True, timeout=30
    )
    assert started.returncode == 2, started.stderr
    lines = started.stderr.splitlines()
    # One line per bad variable, naming it.
    for rule in (
        "GRPC_MAX_RECEIVE_BYTES must be >= 1024 (got 100)",
        "GRPC_IDLE_TIMEOUT_MS must be >= 1 (got 0)",
        "GRPC_HANDSHAKE_TIMEOUT_MS must be an integer (got 'soon')",
    ):
        assert f"{program}: invalid configuration: {rule}" in lines


def submit_request(task_id: str, config_bytes: int) -> worker_v1.SubmitTaskRequest:
    """A SubmitTask whose call config is valid JSON of about ``config_bytes`` bytes."""
    config = json.dumps(
        {"function": "hello.hello_world", "callList": [], "pad": "x" * config_bytes}
    )
    return worker_v1.SubmitTaskRequest(
        task=worker_v1.TaskInput(
            task_id=task_id,
            function_call_config=worker_v1.FunctionCallConfig(
                type="CallListCallConfig", config=config
            ),
            result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
        )
    )


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def test_a_request_above_the_limit_is_refused_before_it_is_read(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(GRPC_MAX_RECEIVE_BYTES=str(1 * MIB))
    async with serving(worker) as [stub]:
        # Just under the limit: read and answered as usual.
        small = await stub.submit_task(submit_request("bounds-small", 1 * MIB - 4096), timeout=30)
        assert small.task_id == "bounds-small"

        before = rss_bytes(worker.proc.pid)
        with pytest.raises(GRPCError) as refused:
            await stub.submit_task(submit_request("bounds-huge", 100 * MIB), timeout=60)
        assert refused.value.status is Status.RESOURCE_EXHAUSTED
        assert "GRPC_MAX_RECEIVE_BYTES" in (refused.value.message or "")
        assert f"at most {1 * MIB}" in (refused.value.message or "")
        # Refused from its length prefix: the Worker held at most the flow-control
        # windows of it, never the 100 MB body (before the limit it grew by ~466 MB).
        assert rss_bytes(worker.proc.pid) - before < 32 * MIB
        assert await worker.health() == HealthCheckResponse.SERVING
    assert "ERROR" not in worker.output()


async def test_results_above_the_receive_limit_are_fetched(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    # The limit bounds requests only: a result up to MAX_COLLECTED_OUTPUT_BYTES comes
    # back whole, and grpclib's client has no receive limit.
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "big.py").write_text("def big(n):\n    return 'x' * n\n")
    worker = start_worker(
        FUNCTIONS_DIR=str(functions),
        GRPC_MAX_RECEIVE_BYTES=str(1 * MIB),
        MAX_COLLECTED_OUTPUT_BYTES=str(8 * MIB),
    )
    async with serving(worker) as [stub]:
        final = await run_to_end(stub, call_list_task("bounds-big", "big", [[7 * MIB]]))
        [plugin] = execute_result(final).plugin_results
        assert plugin.success, plugin.failure_message
        assert len(plugin.result) > 7 * MIB
        fetched = await stub.get_task_result(
            worker_v1.GetTaskResultRequest(task_id="bounds-big"), timeout=30
        )
        assert fetched.result is not None
        assert fetched.result.execute_result is not None
        assert fetched.result.execute_result.plugin_results[0].result == plugin.result


async def test_connections_that_never_send_the_preface_are_closed(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(GRPC_HANDSHAKE_TIMEOUT_MS="300")
    async with serving(worker):
        loop = asyncio.get_running_loop()
        silent = []
        for _ in range(50):
            sock = socket.create_connection(("127.0.0.1", worker.port))
            sock.setblocking(False)
            silent.append(sock)

        async def until_closed(sock: socket.socket) -> None:
            # The server's SETTINGS may come first; the end is an empty read.
            while await loop.sock_recv(sock, 65536):
                pass

        try:
            async with asyncio.timeout(60):  # a hang guard, not the expectation
                await asyncio.gather(*(until_closed(sock) for sock in silent))
        finally:
            for sock in silent:
                sock.close()
        assert await worker.health() == HealthCheckResponse.SERVING


class RawH2:
    """A client connection driven by h2 over a raw socket: what it reads is only
    what the test asks for."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            # Unvalidated: the tests send headers a conforming client would not.
            h2.config.H2Configuration(
                client_side=True, header_encoding="utf-8", validate_outbound_headers=False
            )
        )

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None) -> RawH2:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        raw.h2.initiate_connection()
        if settings:
            raw.h2.update_settings(settings)
        await raw.flush()
        return raw

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def events(self) -> AsyncIterator[h2.events.Event]:
        """Events until the server closes the connection."""
        while data := await self.reader.read(65536):
            for event in self.h2.receive_data(data):
                yield event
            await self.flush()  # SETTINGS and PING acknowledgements

    def close(self) -> None:
        self.writer.close()


async def test_the_server_advertises_its_stream_limit_and_closes_idle_connections(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(GRPC_IDLE_TIMEOUT_MS="300")
    async with serving(worker):
        raw = await RawH2.connect(worker.port)
        try:
            seen: list[type[h2.events.Event]] = []
            async with asyncio.timeout(60):  # a hang guard, not the expectation
                async for event in raw.events():
                    seen.append(type(event))
        finally:
            raw.close()
        assert raw.h2.remote_settings[SettingCodes.MAX_CONCURRENT_STREAMS] == 1000
        # Idle after its handshake: told GOAWAY, then closed.
        assert h2.events.ConnectionTerminated in seen
        assert await worker.health() == HealthCheckResponse.SERVING


async def test_a_connection_with_an_open_stream_is_not_idle(start_worker: StartWorker) -> None:
    worker = start_worker(GRPC_IDLE_TIMEOUT_MS="200")
    async with serving(worker):
        raw = await RawH2.connect(worker.port)
        # A unary call whose request never comes: the stream stays open.
        stream_id = raw.h2.get_next_available_stream_id()
        raw.h2.send_headers(stream_id, grpc_headers("/worker.v1.WorkerService/GetTaskResult"))
        await raw.flush()
        closed = asyncio.Event()

        async def pump() -> None:
            async for _ in raw.events():
                pass
            closed.set()

        pumping = asyncio.create_task(pump())
        try:
            # Five idle timeouts with the stream open: the connection stays.
            await asyncio.sleep(1.0)
            assert not closed.is_set()
            # Once the stream ends, the connection is idle and closed.
            raw.h2.reset_stream(stream_id)
            await raw.flush()
            async with asyncio.timeout(60):  # a hang guard, not the expectation
                await closed.wait()
        finally:
            pumping.cancel()
            raw.close()


async def test_headers_grpclib_would_fail_on_are_refused_without_an_error(
    start_worker: StartWorker,
) -> None:
    worker = start_worker()
    async with serving(worker):
        raw = await RawH2.connect(worker.port)
        try:
            no_path = raw.h2.get_next_available_stream_id()
            headers = grpc_headers("/worker.v1.WorkerService/GetTaskResult")
            raw.h2.send_headers(no_path, [h for h in headers if h[0] != ":path"], end_stream=True)
            bad_bin = raw.h2.get_next_available_stream_id()
            raw.h2.send_headers(bad_bin, [*headers, ("x-trace-bin", "a")], end_stream=True)
            await raw.flush()
            reset: set[int] = set()
            answers: dict[int, dict[str, str]] = {}
            async with asyncio.timeout(60):  # a hang guard, not the expectation
                async for event in raw.events():
                    if isinstance(event, h2.events.StreamReset):
                        reset.add(event.stream_id)
                    if isinstance(event, h2.events.ResponseReceived):
                        answers[event.stream_id] = {str(k): str(v) for k, v in event.headers or ()}
                    if no_path in reset and bad_bin in answers:
                        break
        finally:
            raw.close()
        assert answers[bad_bin]["grpc-status"] == str(Status.INVALID_ARGUMENT.value)
        assert "x-trace-bin" in answers[bad_bin]["grpc-message"]
        assert await worker.health() == HealthCheckResponse.SERVING
    assert " ERROR " not in worker.output()


def grpc_headers(path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc+proto"),
        ("te", "trailers"),
    ]


# --- a client that never reads, against an in-process server ------------------------

MESSAGE_BYTES = 1 * MIB
MESSAGES = 64  # 64 MiB of responses, far beyond any socket or window buffer


class Flood(worker_v1.WorkerServiceBase):
    """WatchTasks answers MESSAGES updates of MESSAGE_BYTES each, counting what it yields."""

    def __init__(self) -> None:
        self.yielded = 0

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        for _ in range(MESSAGES):
            self.yielded += 1
            yield worker_v1.TaskUpdate(task_id="t", error="x" * MESSAGE_BYTES)


async def test_a_client_that_never_reads_holds_one_message_in_the_server() -> None:
    flood = Flood()
    server = bounded_server([flood], limits=GrpcLimits())
    protocols: list[H2Protocol] = []
    factory = server._protocol_factory

    def recording_factory() -> H2Protocol:
        protocol = factory()
        protocols.append(protocol)
        return protocol

    server._protocol_factory = recording_factory  # type: ignore[method-assign]
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    # The largest windows HTTP/2 allows: flow control does not hold the server back,
    # only the socket the client never reads.
    raw = await RawH2.connect(port, {SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    try:
        raw.h2.increment_flow_control_window(2**31 - 1 - 65535)
        stream_id = raw.h2.get_next_available_stream_id()
        raw.h2.send_headers(stream_id, grpc_headers("/worker.v1.WorkerService/WatchTasks"))
        raw.h2.send_data(stream_id, b"\x00\x00\x00\x00\x00", end_stream=True)
        await raw.flush()
        # Read only the server's SETTINGS (so that it sees ours acknowledged), then stop.
        raw.h2.receive_data(await raw.reader.read(1024))
        await raw.flush()
        # From here nothing is read: the StreamReader stops the socket once its
        # buffer is full.

        async def stalled() -> bool:
            await asyncio.sleep(0.05)
            return bool(protocols) and not protocols[0].connection.write_ready.is_set()

        async with asyncio.timeout(60):  # a hang guard, not the expectation
            while not await stalled():
                pass
        transport = protocols[0].connection._transport
        # The transport paused writing: what the server holds for this client is its
        # write buffer (the high-water mark plus at most one frame), and the messages
        # it had not yet sent are still ungenerated in WatchTasks.
        assert transport.get_write_buffer_size() < 1 * MIB
        assert flood.yielded < MESSAGES
    finally:
        raw.close()
        server.close()
        await server.wait_closed()
