"""The proxy router in-process on a real Unix socket, in front of fake upstreams.

The fakes are small grpclib servers on TCP ports (a coordinator, a bundle
coordinator, a sync invoker, two workers, and a raw-bytes worker that echoes
what it saw); clients are grpclib stubs, grpclib raw channels, the official
grpcio client, and a bare HTTP/2 client where a grpc-timeout must be exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler, Status
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from lost_connections import ClosedUnderTheCall
from support import free_port, wait_until

from blockx_core.addr import WORKER_ADDR_HEADER
from blockx_proto import bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1
from blockx_proto.channel import PASS_THROUGH_DETAILS, PassThroughStatusDetailsCodec
from blockx_server.proxy.app import ProxyServer, claim_socket_path
from blockx_server.proxy.codec import PASS_THROUGH, PassThroughCodec
from blockx_server.proxy.config import ProxyConfig
from blockx_server.proxy.service import (
    MISSING_WORKER_ADDR,
    Route,
    Upstream,
    generated_routes,
)
from blockx_server.runtime.env import ConfigError

SUBMIT = "/worker.v1.WorkerService/SubmitTask"
GET_RESULT = "/worker.v1.WorkerService/GetTaskResult"
# A bidirectional-streaming method only the tests know, routed like worker.v1.
CHAT = "/test.v1.Echo/Chat"
ROUTES = {**generated_routes(), CHAT: Route(Cardinality.STREAM_STREAM, Upstream.WORKER)}


@dataclass
class Seen:
    """What a fake upstream received: per call, its method, metadata and deadline."""

    calls: list[tuple[str, list[tuple[str, Any]], float | None]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def last(self) -> tuple[str, list[tuple[str, Any]], float | None]:
        return self.calls[-1]


def record(server: Server, seen: Seen) -> None:
    async def on_request(event: RecvRequest) -> None:
        remaining = event.deadline.time_remaining() if event.deadline else None
        seen.calls.append((event.method_name, list(event.metadata.items()), remaining))

    listen(server, RecvRequest, on_request)


async def hang(seen: Seen) -> None:
    """Never answers; notes that the call was cancelled."""
    try:
        await asyncio.Future()
    finally:
        seen.cancelled.set()


class FakeCoordinator(coordinator_v1.CoordinatorServiceBase):
    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        if message.task_id == "no-slot":
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "all candidates rejected (w1: no slot)")
        if message.task_id == "hang":
            await hang(self.seen)
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr="from-block-coordinator", slot_id="s-1"
        )


class FakeBundleCoordinator(bundlecoordinator_v1.BundleCoordinatorServiceBase):
    async def reserve_worker_slot(
        self, message: bundlecoordinator_v1.ReserveWorkerSlotRequest
    ) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
        return bundlecoordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr="from-bundle-coordinator", slot_id="b-1"
        )


class FakeSyncInvoker(syncinvoker_v1.SyncInvokerServiceBase):
    async def invoke(self, message: syncinvoker_v1.InvokeRequest) -> syncinvoker_v1.InvokeResponse:
        return syncinvoker_v1.InvokeResponse(
            call_id=message.call_id, success=True, result=f"invoked {message.function}".encode()
        )

    async def precheck(
        self, message: syncinvoker_v1.PrecheckRequest
    ) -> syncinvoker_v1.PrecheckResponse:
        return syncinvoker_v1.PrecheckResponse(ok=True, signature=f"{message.function}(name)")


class FakeWorker(worker_v1.WorkerServiceBase):
    """Answers with its own name; WatchTasks streams ``updates`` per task.

    Task ids script it: ``gated`` waits for ``gate`` after the first update,
    ``forever`` never ends, ``missing`` is NOT_FOUND.
    """

    def __init__(self, name: str, seen: Seen, updates: int = 50) -> None:
        self.name = name
        self.seen = seen
        self.updates = updates
        self.gate = asyncio.Event()

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        return worker_v1.TaskSnapshot(
            task_id=message.task_id,
            slot_id=f"{self.name}/slot",
            state=worker_v1.TaskState.ALLOCATED,
            worker_addr=self.name,
        )

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        assert message.task is not None
        return worker_v1.SubmitTaskResponse(
            task_id=message.task.task_id,
            state=worker_v1.TaskState.RUNNING,
            slot_id=message.slot_id,
            worker_addr=self.name,
        )

    async def get_task_result(
        self, message: worker_v1.GetTaskResultRequest
    ) -> worker_v1.GetTaskResultResponse:
        if message.task_id == "missing":
            raise GRPCError(Status.NOT_FOUND, f"task missing: no result on {self.name}")
        return worker_v1.GetTaskResultResponse(
            task_id=message.task_id, state=worker_v1.TaskState.SUCCEEDED
        )

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        task_id = message.task_ids[0]
        for n in range(self.updates):
            yield worker_v1.TaskUpdate(
                task_id=task_id, worker_addr=self.name, timestamp_ms=n, is_terminal=False
            )
            if n == 0 and task_id == "gated":
                await self.gate.wait()
            if n == 0 and task_id == "forever":
                await hang(self.seen)


class RawWorker:
    """A worker speaking bytes: echoes SubmitTask and Chat, and answers GetTaskResult
    with a scripted error carrying details and trailing metadata."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def __mapping__(self) -> dict[str, Handler]:
        return {
            SUBMIT: Handler(self.echo, Cardinality.UNARY_UNARY, bytes, bytes),
            GET_RESULT: Handler(self.fail, Cardinality.UNARY_UNARY, bytes, bytes),
            CHAT: Handler(self.chat, Cardinality.STREAM_STREAM, bytes, bytes),
        }

    async def echo(self, stream: Stream[bytes, bytes]) -> None:
        request = await stream.recv_message()
        assert request is not None
        self.received.append(request)
        await stream.send_initial_metadata(metadata={"x-served-by": "raw"})
        await stream.send_message(request)
        await stream.send_trailing_metadata(metadata={"x-echoed-bytes": str(len(request))})

    async def fail(self, stream: Stream[bytes, bytes]) -> None:
        await stream.recv_message()
        await stream.send_trailing_metadata(
            status=Status.FAILED_PRECONDITION,
            status_message="slot s-9 is not ALLOCATED — ünïcode kept",
            status_details=b"\x08\x09raw details",
            metadata={"x-retry-after-ms": "250"},
        )

    async def chat(self, stream: Stream[bytes, bytes]) -> None:
        async for message in stream:
            await stream.send_message(b"echo:" + message)


@dataclass
class Upstreams:
    coordinator: Seen
    worker_a: FakeWorker
    worker_b: FakeWorker
    raw: RawWorker
    raw_seen: Seen
    addrs: dict[str, str]


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    servers: list[Server] = []
    addrs: dict[str, str] = {}

    async def start(name: str, handler: Any, seen: Seen, *, raw: bool = False) -> None:
        server = (
            Server(
                [handler],
                codec=PassThroughCodec(),
                status_details_codec=PassThroughStatusDetailsCodec(),
            )
            if raw
            else Server([handler])
        )
        record(server, seen)
        port = free_port()
        await server.start("127.0.0.1", port)
        servers.append(server)
        addrs[name] = f"127.0.0.1:{port}"

    coordinator_seen, a_seen, b_seen, raw_seen, other = Seen(), Seen(), Seen(), Seen(), Seen()
    await start("coordinator", FakeCoordinator(coordinator_seen), coordinator_seen)
    await start("bundle", FakeBundleCoordinator(), other)
    await start("sync", FakeSyncInvoker(), other)
    # Workers answer with their own address, as real ones do.
    port_a, port_b = free_port(), free_port()
    worker_a = FakeWorker(f"127.0.0.1:{port_a}", a_seen)
    worker_b = FakeWorker(f"127.0.0.1:{port_b}", b_seen)
    for name, worker, port in (("a", worker_a, port_a), ("b", worker_b, port_b)):
        server = Server([worker])
        record(server, worker.seen)
        await server.start("127.0.0.1", port)
        servers.append(server)
        addrs[name] = worker.name
    raw = RawWorker()
    await start("raw", raw, raw_seen, raw=True)
    yield Upstreams(coordinator_seen, worker_a, worker_b, raw, raw_seen, addrs)
    for server in servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of a Unix socket path.
    path = Path(tempfile.mkdtemp(prefix="bxp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def proxy_config(socket_path: Path, upstreams: Upstreams, **overrides: Any) -> ProxyConfig:
    fields: dict[str, Any] = {
        "socket_path": str(socket_path),
        "coordinator_addr": upstreams.addrs["coordinator"],
        "bundle_coordinator_addr": upstreams.addrs["bundle"],
        "sync_invoker_addr": upstreams.addrs["sync"],
        "connect_timeout_ms": 2000,
        # The proxy forwards worker.v1 calls only to Workers it knows.
        "allowed_workers": tuple(upstreams.addrs.values()),
        **overrides,
    }
    return ProxyConfig(**fields)


@pytest.fixture
async def proxy(socket_dir: Path, upstreams: Upstreams) -> AsyncIterator[ProxyServer]:
    async with ProxyServer(proxy_config(socket_dir / "p.sock", upstreams), ROUTES) as server:
        yield server


@pytest.fixture
async def channel(proxy: ProxyServer) -> AsyncIterator[Channel]:
    ch = Channel(path=proxy.config.socket_path)
    yield ch
    ch.close()


@pytest.fixture
async def raw_channel(proxy: ProxyServer) -> AsyncIterator[Channel]:
    """A client that sends and receives bytes, as the proxy does."""
    ch = Channel(
        path=proxy.config.socket_path,
        codec=PassThroughCodec(),
        status_details_codec=PassThroughStatusDetailsCodec(),
    )
    yield ch
    ch.close()


def at(addr: str) -> dict[str, str]:
    return {WORKER_ADDR_HEADER: addr}


async def status_of(call: Any) -> tuple[Status, str | None]:
    with pytest.raises(GRPCError) as info:
        await call
    return info.value.status, info.value.message


# --- routing -----------------------------------------------------------------


async def test_every_service_is_routed_by_method_path(
    channel: Channel, upstreams: Upstreams
) -> None:
    block = await coordinator_v1.CoordinatorServiceStub(channel).reserve_worker_slot(
        coordinator_v1.ReserveWorkerSlotRequest(task_id="t1")
    )
    assert (block.task_id, block.worker_addr) == ("t1", "from-block-coordinator")
    bundle = await bundlecoordinator_v1.BundleCoordinatorServiceStub(channel).reserve_worker_slot(
        bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id="t2")
    )
    assert (bundle.task_id, bundle.worker_addr) == ("t2", "from-bundle-coordinator")
    sync = syncinvoker_v1.SyncInvokerServiceStub(channel)
    invoked = await sync.invoke(syncinvoker_v1.InvokeRequest(function="hello_world", call_id="c1"))
    assert (invoked.call_id, invoked.result) == ("c1", b"invoked hello_world")
    checked = await sync.precheck(syncinvoker_v1.PrecheckRequest(function="hello_world"))
    assert checked.signature == "hello_world(name)"
    worker = worker_v1.WorkerServiceStub(channel)
    addr = upstreams.addrs["a"]
    snapshot = await worker.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="t3", ttl_ms=5000), metadata=at(addr)
    )
    assert (snapshot.task_id, snapshot.worker_addr) == ("t3", addr)


async def test_the_worker_header_picks_the_worker(channel: Channel, upstreams: Upstreams) -> None:
    stub = worker_v1.WorkerServiceStub(channel)
    for name in ("a", "b", "a", "b"):
        addr = upstreams.addrs[name]
        snapshot = await stub.request_task_slot(
            worker_v1.RequestTaskSlotRequest(task_id=f"t-{name}", ttl_ms=5000), metadata=at(addr)
        )
        assert snapshot.worker_addr == addr
        submitted = await stub.submit_task(
            worker_v1.SubmitTaskRequest(
                task=worker_v1.TaskInput(task_id=f"t-{name}"), slot_id=snapshot.slot_id
            ),
            metadata=at(addr),
        )
        assert (submitted.worker_addr, submitted.slot_id) == (addr, f"{addr}/slot")
        result = await stub.get_task_result(
            worker_v1.GetTaskResultRequest(task_id=f"t-{name}"), metadata=at(addr)
        )
        assert result.state is worker_v1.TaskState.SUCCEEDED
    # Each worker saw its own calls, and only them.
    for worker in (upstreams.worker_a, upstreams.worker_b):
        assert [method.rsplit("/", 1)[1] for method, _, _ in worker.seen.calls] == [
            "RequestTaskSlot",
            "SubmitTask",
            "GetTaskResult",
        ] * 2


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, MISSING_WORKER_ADDR),
        ("worker-7", "must be host:port"),
        ("127.0.0.1:", "must be host:port"),
        (":9090", "must be host:port"),
        ("127.0.0.1:99999", "must be host:port"),
        ("127.0.0.1:0", "must be host:port"),
        ("::1:9090", "must be host:port"),
    ],
)
async def test_a_missing_or_malformed_worker_header_is_invalid_argument(
    channel: Channel, header: str | None, expected: str
) -> None:
    stub = worker_v1.WorkerServiceStub(channel)
    metadata = at(header) if header is not None else None
    status, message = await status_of(
        stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="t"), metadata=metadata)
    )
    assert status is Status.INVALID_ARGUMENT
    assert message is not None
    assert expected in message
    assert WORKER_ADDR_HEADER in message
    # Streaming calls are checked the same way.
    status, _ = await status_of(
        _drain(stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=["t"]), metadata=metadata))
    )
    assert status is Status.INVALID_ARGUMENT


async def test_the_worker_header_may_not_name_two_workers(
    channel: Channel, upstreams: Upstreams
) -> None:
    stub = worker_v1.WorkerServiceStub(channel)
    metadata = [
        (WORKER_ADDR_HEADER, upstreams.addrs["a"]),
        (WORKER_ADDR_HEADER, upstreams.addrs["b"]),
    ]
    status, message = await status_of(
        stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="t"), metadata=metadata)
    )
    assert status is Status.INVALID_ARGUMENT
    assert message is not None
    assert "exactly one worker" in message


async def test_an_unknown_path_is_unimplemented(raw_channel: Channel) -> None:
    async def call_unknown() -> None:
        # The error leaves the ``async with``: grpclib's client, after an error it
        # raised on a response without content-type, waits for trailers on the way out.
        async with raw_channel.request(
            "/nope.v1.NopeService/Call", Cardinality.UNARY_UNARY, bytes, bytes
        ) as call:
            await call.send_message(b"", end=True)
            await call.recv_message()

    with pytest.raises(GRPCError) as info:
        await call_unknown()
    assert info.value.status is Status.UNIMPLEMENTED
    assert info.value.message is not None
    assert "/nope.v1.NopeService/Call is not routed" in info.value.message


async def test_without_a_bundle_coordinator_its_calls_are_unavailable(
    socket_dir: Path, upstreams: Upstreams
) -> None:
    config = proxy_config(socket_dir / "nb.sock", upstreams, bundle_coordinator_addr=None)
    async with ProxyServer(config), Channel(path=config.socket_path) as ch:
        status, message = await status_of(
            bundlecoordinator_v1.BundleCoordinatorServiceStub(ch).reserve_worker_slot(
                bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id="t")
            )
        )
        assert status is Status.UNAVAILABLE
        assert message is not None
        assert "no bundle coordinator is configured" in message
        # The block coordinator is still served.
        await coordinator_v1.CoordinatorServiceStub(ch).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="t")
        )


# --- streaming ---------------------------------------------------------------


async def _drain(updates: AsyncIterator[worker_v1.TaskUpdate]) -> list[worker_v1.TaskUpdate]:
    return [update async for update in updates]


async def test_watch_tasks_streams_every_message_in_order(
    channel: Channel, upstreams: Upstreams
) -> None:
    stub = worker_v1.WorkerServiceStub(channel)
    addr = upstreams.addrs["b"]
    async with asyncio.timeout(10):
        updates = await _drain(
            stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=["t"]), metadata=at(addr))
        )
    assert [u.timestamp_ms for u in updates] == list(range(upstreams.worker_b.updates))
    assert {u.worker_addr for u in updates} == {addr}


async def test_watch_tasks_forwards_each_update_as_it_arrives(
    channel: Channel, upstreams: Upstreams
) -> None:
    worker = upstreams.worker_a
    updates = worker_v1.WorkerServiceStub(channel).watch_tasks(
        worker_v1.WatchTasksRequest(task_ids=["gated"]), metadata=at(worker.name)
    )
    async with asyncio.timeout(10):
        # The upstream holds the rest back until the first update has come through.
        first = await anext(updates)
        assert first.timestamp_ms == 0
        worker.gate.set()
        rest = await _drain(updates)
    assert [u.timestamp_ms for u in rest] == list(range(1, worker.updates))


async def test_a_caller_going_away_cancels_the_upstream_call(
    channel: Channel, upstreams: Upstreams
) -> None:
    worker = upstreams.worker_a
    first = asyncio.Event()

    async def watch() -> None:
        async for _ in worker_v1.WorkerServiceStub(channel).watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=["forever"]), metadata=at(worker.name)
        ):
            first.set()

    task = asyncio.create_task(watch())
    async with asyncio.timeout(10):
        await first.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await wait_until(worker.seen.cancelled.is_set, "the upstream WatchTasks to be cancelled")


async def test_a_bidirectional_stream_is_forwarded_both_ways(
    raw_channel: Channel, upstreams: Upstreams
) -> None:
    async with (
        asyncio.timeout(10),
        raw_channel.request(
            CHAT, Cardinality.STREAM_STREAM, bytes, bytes, metadata=at(upstreams.addrs["raw"])
        ) as call,
    ):
        for word in (b"one", b"two", b"three"):
            await call.send_message(word)
            assert await call.recv_message() == b"echo:" + word
        await call.end()
        assert await call.recv_message() is None


# --- errors and deadlines ----------------------------------------------------


async def test_an_upstream_error_passes_through_unchanged(
    channel: Channel, upstreams: Upstreams
) -> None:
    status, message = await status_of(
        coordinator_v1.CoordinatorServiceStub(channel).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="no-slot")
        )
    )
    assert (status, message) == (Status.RESOURCE_EXHAUSTED, "all candidates rejected (w1: no slot)")
    addr = upstreams.addrs["a"]
    status, message = await status_of(
        worker_v1.WorkerServiceStub(channel).get_task_result(
            worker_v1.GetTaskResultRequest(task_id="missing"), metadata=at(addr)
        )
    )
    assert (status, message) == (Status.NOT_FOUND, f"task missing: no result on {addr}")


async def test_error_details_and_response_metadata_pass_through(
    raw_channel: Channel, upstreams: Upstreams
) -> None:
    async with raw_channel.request(
        GET_RESULT, Cardinality.UNARY_UNARY, bytes, bytes, metadata=at(upstreams.addrs["raw"])
    ) as call:
        await call.send_message(b"", end=True)
        with pytest.raises(GRPCError) as info:
            await call.recv_message()
    assert info.value.status is Status.FAILED_PRECONDITION
    assert info.value.message == "slot s-9 is not ALLOCATED — ünïcode kept"
    assert info.value.details == b"\x08\x09raw details"
    assert call.trailing_metadata is not None
    assert call.trailing_metadata.get("x-retry-after-ms") == "250"


async def test_an_unreachable_upstream_is_unavailable_naming_its_address(
    channel: Channel, socket_dir: Path, upstreams: Upstreams
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    # A Worker the proxy forwards to (a registered one that has since died).
    config = proxy_config(
        socket_dir / "dead.sock", upstreams, coordinator_addr=dead, allowed_workers=(dead,)
    )
    async with ProxyServer(config), Channel(path=config.socket_path) as ch:
        status, message = await status_of(
            worker_v1.WorkerServiceStub(ch).get_task_result(
                worker_v1.GetTaskResultRequest(task_id="t"), metadata=at(dead)
            )
        )
        assert status is Status.UNAVAILABLE
        assert message is not None
        assert f"worker {dead}" in message
        status, message = await status_of(
            coordinator_v1.CoordinatorServiceStub(ch).reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id="t")
            )
        )
    assert status is Status.UNAVAILABLE
    assert message is not None
    assert f"block coordinator {dead}" in message


async def test_an_upstream_call_cut_off_inside_grpclib_is_unavailable(
    channel: Channel, proxy: ProxyServer, upstreams: Upstreams
) -> None:
    addr = upstreams.addrs["a"]
    host, port = addr.rsplit(":", 1)
    proxy.router.pool._channels[addr] = [
        ClosedUnderTheCall(
            host, int(port), codec=PASS_THROUGH, status_details_codec=PASS_THROUGH_DETAILS
        )
    ]
    status, message = await status_of(
        worker_v1.WorkerServiceStub(channel).get_task_result(
            worker_v1.GetTaskResultRequest(task_id="t"), metadata=at(addr)
        )
    )
    assert status is Status.UNAVAILABLE
    assert message == f"lost the call to worker {addr}"


async def h2_call(
    socket_path: str,
    path: str,
    message: bytes,
    *,
    timeout: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> dict[str, str]:
    """One unary call by hand: headers no grpc client would send, or an exact
    ``grpc-timeout`` with no client-side deadline (a grpc client would give up at
    the same instant as the proxy). The response headers and trailers, merged."""
    reader, writer = await asyncio.open_unix_connection(socket_path)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    stream_id = conn.get_next_available_stream_id()
    conn.send_headers(
        stream_id,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            *([("grpc-timeout", timeout)] if timeout else []),
            *headers,
        ],
    )
    conn.send_data(stream_id, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True)
    writer.write(conn.data_to_send())
    answer: dict[str, str] = {}
    try:
        async with asyncio.timeout(10):
            while True:
                data = await reader.read(65536)
                assert data, "the proxy closed the connection"
                events = conn.receive_data(data)
                writer.write(conn.data_to_send())
                for event in events:
                    if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                        answer.update(_text_headers(event.headers))
                    if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                        return answer
    finally:
        writer.close()
        await writer.wait_closed()


def _text_headers(pairs: Any) -> Iterator[tuple[str, str]]:
    for key, value in pairs:
        yield (
            key.decode() if isinstance(key, bytes) else key,
            value.decode() if isinstance(value, bytes) else value,
        )


async def test_the_callers_deadline_reaches_the_upstream_and_ends_the_call(
    proxy: ProxyServer, upstreams: Upstreams
) -> None:
    request = bytes(coordinator_v1.ReserveWorkerSlotRequest(task_id="hang"))
    started = time.monotonic()
    answer = await h2_call(
        proxy.config.socket_path,
        "/coordinator.v1.CoordinatorService/ReserveWorkerSlot",
        request,
        timeout="300m",
    )
    elapsed = time.monotonic() - started
    assert answer.get("grpc-status") == str(Status.DEADLINE_EXCEEDED.value), answer
    assert 0.25 < elapsed < 5
    _, _, remaining = upstreams.coordinator.last()
    assert remaining is not None
    assert 0 < remaining <= 0.3
    await wait_until(upstreams.coordinator.cancelled.is_set, "the upstream call to be cancelled")


async def test_a_grpclib_callers_timeout_ends_the_call(
    channel: Channel, upstreams: Upstreams
) -> None:
    # grpclib raises its own TimeoutError or the proxy's DEADLINE_EXCEEDED, whichever
    # comes first; either way the upstream call must not outlive the caller. The
    # deadline leaves a loaded machine time to forward the call first.
    call = asyncio.create_task(
        coordinator_v1.CoordinatorServiceStub(channel).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="hang"), timeout=2.0
        )
    )
    await wait_until(lambda: bool(upstreams.coordinator.calls), "the call to reach upstream")
    with pytest.raises((TimeoutError, GRPCError)) as info:
        await call
    if isinstance(info.value, GRPCError):
        assert info.value.status is Status.DEADLINE_EXCEEDED
    await wait_until(upstreams.coordinator.cancelled.is_set, "the upstream call to be cancelled")


# --- bytes and metadata ------------------------------------------------------


def _unknown_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field no .proto declares (field numbers < 2048 here)."""
    tag = (number << 3) | 2
    return _varint(tag) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


async def test_message_bytes_pass_through_unchanged(
    raw_channel: Channel, upstreams: Upstreams
) -> None:
    request = bytes(
        worker_v1.SubmitTaskRequest(task=worker_v1.TaskInput(task_id="t-raw"), slot_id="s-1")
    ) + _unknown_field(1999, b"not in any .proto")
    async with raw_channel.request(
        SUBMIT, Cardinality.UNARY_UNARY, bytes, bytes, metadata=at(upstreams.addrs["raw"])
    ) as call:
        await call.send_message(request, end=True)
        reply = await call.recv_message()
        await call.recv_trailing_metadata()
    assert upstreams.raw.received == [request]
    assert reply == request
    assert call.initial_metadata is not None
    assert call.initial_metadata.get("x-served-by") == "raw"
    assert call.trailing_metadata is not None
    assert call.trailing_metadata.get("x-echoed-bytes") == str(len(request))


async def test_request_metadata_is_forwarded_without_the_routing_header(
    channel: Channel, upstreams: Upstreams
) -> None:
    addr = upstreams.addrs["a"]
    await worker_v1.WorkerServiceStub(channel).get_task_result(
        worker_v1.GetTaskResultRequest(task_id="t"),
        metadata=[
            (WORKER_ADDR_HEADER, addr),
            ("x-request-id", "r-42"),
            ("x-tag", "one"),
            ("x-tag", "two"),
            ("trace-bin", b"\x00\x01\xff"),
        ],
    )
    method, metadata, remaining = upstreams.worker_a.seen.last()
    assert method == GET_RESULT
    assert metadata == [
        ("x-request-id", "r-42"),
        ("x-tag", "one"),
        ("x-tag", "two"),
        ("trace-bin", b"\x00\x01\xff"),
    ]
    assert remaining is None  # no caller deadline, none invented


async def test_metadata_grpclib_cannot_send_on_is_dropped_not_fatal(
    proxy: ProxyServer, upstreams: Upstreams
) -> None:
    answer = await h2_call(
        proxy.config.socket_path,
        SUBMIT,
        b"\x0a\x00",
        headers=(
            (WORKER_ADDR_HEADER, upstreams.addrs["raw"]),
            ("x-kept", "yes"),
            ("x-tabbed", "a\tb"),  # valid HTTP/2, refused by grpclib's encoder
        ),
    )
    assert answer.get("grpc-status") == "0", answer
    _, metadata, _ = upstreams.raw_seen.last()
    assert metadata == [("x-kept", "yes")]


# --- the grpcio client ---------------------------------------------------------


async def test_the_official_grpcio_client_works_through_the_proxy(
    proxy: ProxyServer, upstreams: Upstreams
) -> None:
    addr = upstreams.addrs["a"]
    async with grpc.aio.insecure_channel(f"unix:{proxy.config.socket_path}") as ch:
        reserve = ch.unary_unary(
            "/coordinator.v1.CoordinatorService/ReserveWorkerSlot",
            request_serializer=bytes,
            response_deserializer=coordinator_v1.ReserveWorkerSlotResponse.parse,
        )
        reply = await reserve(coordinator_v1.ReserveWorkerSlotRequest(task_id="t-grpcio"))
        assert reply.worker_addr == "from-block-coordinator"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await reserve(coordinator_v1.ReserveWorkerSlotRequest(task_id="no-slot"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == "all candidates rejected (w1: no slot)"
        watch = ch.unary_stream(
            "/worker.v1.WorkerService/WatchTasks",
            request_serializer=bytes,
            response_deserializer=worker_v1.TaskUpdate.parse,
        )
        updates = [
            u
            async for u in watch(
                worker_v1.WatchTasksRequest(task_ids=["t"]),
                metadata=((WORKER_ADDR_HEADER, addr),),
            )
        ]
        assert [u.timestamp_ms for u in updates] == list(range(upstreams.worker_a.updates))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await reserve(coordinator_v1.ReserveWorkerSlotRequest(task_id="hang"), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        no_header = ch.unary_unary(
            "/worker.v1.WorkerService/GetTaskResult",
            request_serializer=bytes,
            response_deserializer=worker_v1.GetTaskResultResponse.parse,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await no_header(worker_v1.GetTaskResultRequest(task_id="t"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == MISSING_WORKER_ADDR


# --- the channel pool ----------------------------------------------------------


async def test_the_pool_is_capped_and_spares_channels_in_use(
    socket_dir: Path, upstreams: Upstreams
) -> None:
    config = proxy_config(socket_dir / "cap.sock", upstreams, max_upstreams=1)
    a, b = upstreams.worker_a, upstreams.worker_b
    async with ProxyServer(config) as proxy, Channel(path=config.socket_path) as ch:
        stub = worker_v1.WorkerServiceStub(ch)
        # A stream to A stays open while B's call pushes A's channel out of the pool.
        updates = stub.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=["gated"]), metadata=at(a.name)
        )
        async with asyncio.timeout(10):
            assert (await anext(updates)).timestamp_ms == 0
            for worker in (b, a, b):
                snapshot = await stub.request_task_slot(
                    worker_v1.RequestTaskSlotRequest(task_id="t", ttl_ms=5000),
                    metadata=at(worker.name),
                )
                assert snapshot.worker_addr == worker.name
                assert len(proxy.router.pool) == 1
                assert worker.name in proxy.router.pool
            a.gate.set()
            rest = await _drain(updates)
        assert [u.timestamp_ms for u in rest] == list(range(1, a.updates))


async def test_a_busy_upstream_gets_another_connection(
    proxy: ProxyServer, upstreams: Upstreams
) -> None:
    # grpclib servers accept 100 concurrent calls per connection: with 100 open
    # WatchTasks streams to one worker, its next call needs a second connection.
    worker = upstreams.worker_a
    first_updates = 0

    async def watch(stub: worker_v1.WorkerServiceStub, n: int) -> int:
        nonlocal first_updates
        count = 0
        async for _ in stub.watch_tasks(
            worker_v1.WatchTasksRequest(task_ids=["gated"]), metadata=at(worker.name)
        ):
            if count == 0:
                first_updates += 1
            count += 1
        return count

    # The proxy, as a grpclib server too, takes 100 calls per client connection.
    async with (
        Channel(path=proxy.config.socket_path) as watching,
        Channel(path=proxy.config.socket_path) as calling,
        asyncio.TaskGroup() as tasks,
    ):
        stub = worker_v1.WorkerServiceStub(watching)
        watches = [tasks.create_task(watch(stub, n)) for n in range(100)]
        await wait_until(lambda: first_updates == 100, "100 open WatchTasks streams")
        async with asyncio.timeout(10):
            snapshot = await worker_v1.WorkerServiceStub(calling).request_task_slot(
                worker_v1.RequestTaskSlotRequest(task_id="t-101", ttl_ms=5000),
                metadata=at(worker.name),
            )
        assert snapshot.worker_addr == worker.name
        assert proxy.router.pool.connections(worker.name) == 2
        worker.gate.set()
    assert [w.result() for w in watches] == [worker.updates] * 100


# --- the socket file -----------------------------------------------------------


def _stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # bound, never listening: what a killed proxy leaves


async def test_a_stale_socket_is_replaced_and_the_socket_removed_at_exit(
    socket_dir: Path, upstreams: Upstreams
) -> None:
    path = socket_dir / "stale.sock"
    _stale_socket(path)
    config = proxy_config(path, upstreams)
    async with ProxyServer(config), Channel(path=str(path)) as ch:
        await coordinator_v1.CoordinatorServiceStub(ch).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="t")
        )
    assert not path.exists()


async def test_a_live_socket_or_a_file_is_never_taken_over(
    proxy: ProxyServer, socket_dir: Path
) -> None:
    with pytest.raises(ConfigError, match="in use"):
        claim_socket_path(proxy.config.socket_path)
    async with Channel(path=proxy.config.socket_path) as ch:  # still serving
        await coordinator_v1.CoordinatorServiceStub(ch).reserve_worker_slot(
            coordinator_v1.ReserveWorkerSlotRequest(task_id="t")
        )
    regular = socket_dir / "file"
    regular.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        claim_socket_path(str(regular))
    assert regular.read_text() == "not a socket"
