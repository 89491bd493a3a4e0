"""blockx_proto.coalesce over real sockets: the writes of one loop iteration leave in
one send, with the same bytes in the same order; gRPC calls through coalescing
clients and servers (BlockX's bounded server) answer exactly what plain grpclib
answers, with messages far beyond the HTTP/2 flow-control windows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.server import Server
from support import free_port

from blockx_proto import worker_v1
from blockx_proto.coalesce import FLUSH_AT_BYTES, CoalescingChannel, CoalescingTransport
from blockx_server.runtime.connection_limits import GrpcLimits
from blockx_server.runtime.serving import bounded_server


class _Received(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.Event()
        self.arrived = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.arrived.set()

    async def until(self, size: int) -> None:
        while len(self.data) < size:
            self.arrived.clear()
            await self.arrived.wait()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed.set()


class _CountingTransport:
    """The real transport, counting the sends it is asked for."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.sends: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sends.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@contextlib.asynccontextmanager
async def _paired() -> AsyncIterator[tuple[CoalescingTransport, _CountingTransport, _Received]]:
    """A coalescing transport over a counted real TCP connection, and its peer's
    side; closed at the end."""
    loop = asyncio.get_running_loop()
    received = _Received()
    server = await loop.create_server(lambda: received, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    counting = _CountingTransport(transport)
    coalescing = CoalescingTransport(counting, loop)  # type: ignore[arg-type]
    try:
        yield coalescing, counting, received
    finally:
        coalescing.close()
        server.close()


async def test_writes_of_one_iteration_leave_in_one_send_in_order() -> None:
    async with _paired() as (coalescing, counting, received):
        coalescing.write(b"headers|")
        coalescing.write(b"")  # nothing to send: no send of its own
        coalescing.write(bytearray(b"data|"))
        coalescing.writelines([b"trailers|", memoryview(b"next")])
        assert counting.sends == []  # nothing leaves before the iteration ends
        assert coalescing.get_write_buffer_size() == len(b"headers|data|trailers|next")
        async with asyncio.timeout(30):
            await received.until(len(b"headers|data|trailers|next"))
        assert counting.sends == [b"headers|data|trailers|next"]
        assert bytes(received.data) == b"headers|data|trailers|next"
        coalescing.write(b"second")
        async with asyncio.timeout(30):
            await received.until(len(b"headers|data|trailers|nextsecond"))
        assert counting.sends[1:] == [b"second"]


async def test_gathered_writes_reaching_the_bound_are_handed_on_at_once() -> None:
    # So that the transport pauses a protocol whose peer does not read, as it would
    # without coalescing, before the handler produces more.
    async with _paired() as (coalescing, counting, received):
        half = b"h" * (FLUSH_AT_BYTES // 2)
        coalescing.write(half)
        assert counting.sends == []
        coalescing.write(half)  # the bound: sent within this very call
        assert counting.sends == [half + half]
        assert coalescing.get_write_buffer_size() == counting.get_write_buffer_size()
        coalescing.write(b"tail")
        assert len(counting.sends) == 1
        async with asyncio.timeout(30):
            await received.until(FLUSH_AT_BYTES + 4)
        assert counting.sends[1:] == [b"tail"]
        assert bytes(received.data) == half + half + b"tail"


async def test_close_sends_what_was_gathered() -> None:
    async with _paired() as (coalescing, _, received):
        coalescing.write(b"last words")
        coalescing.close()  # in the same iteration as the write
        async with asyncio.timeout(30):
            await received.closed.wait()
        assert bytes(received.data) == b"last words"
        assert coalescing.is_closing()


async def test_abort_drops_what_was_gathered() -> None:
    async with _paired() as (coalescing, counting, received):
        coalescing.write(b"never sent")
        coalescing.abort()
        async with asyncio.timeout(30):
            await received.closed.wait()
        await asyncio.sleep(0)  # the flush scheduled by the write runs: it sends nothing
        assert counting.sends == []
        assert received.data == b""


BIG = 3 * 1024 * 1024  # far beyond the 64 KiB HTTP/2 windows h2 starts with


class _Worker(worker_v1.WorkerServiceBase):
    """SubmitTask answers the task's config reversed as its slot_id; WatchTasks sends a
    numbered update per task_id, each with a large error text."""

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        assert message.task is not None
        assert message.task.function_call_config is not None
        return worker_v1.SubmitTaskResponse(slot_id=message.task.function_call_config.config[::-1])

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        for n, task_id in enumerate(message.task_ids):
            yield worker_v1.TaskUpdate(task_id=task_id, error=f"{n}:" + "u" * (BIG // 8))


async def _serve(coalesce: bool) -> tuple[Server, int]:
    server = bounded_server([_Worker()], limits=GrpcLimits()) if coalesce else Server([_Worker()])
    port = free_port()
    await server.start("127.0.0.1", port)
    return server, port


async def _calls(channel: Channel) -> list[object]:
    stub = worker_v1.WorkerServiceStub(channel)

    async def submit(i: int) -> str:
        config = f"{i}-" + "c" * BIG
        task = worker_v1.TaskInput(
            task_id=f"t{i}",
            function_call_config=worker_v1.FunctionCallConfig(type="x", config=config),
        )
        reply = await stub.submit_task(worker_v1.SubmitTaskRequest(task=task), timeout=60)
        return f"{len(reply.slot_id)} {reply.slot_id[-3:]}"

    async def watch(i: int) -> list[str]:
        request = worker_v1.WatchTasksRequest(task_ids=[f"w{i}-{n}" for n in range(6)])
        updates = [u async for u in stub.watch_tasks(request, timeout=60)]
        return [f"{u.task_id} {u.error[:3]} {len(u.error)}" for u in updates]

    answers = await asyncio.gather(*(submit(i) for i in range(6)), *(watch(i) for i in range(6)))
    return list(answers)


@pytest.mark.parametrize(
    ("client_coalesces", "server_coalesces"), [(True, True), (True, False), (False, True)]
)
async def test_grpc_calls_answer_what_plain_grpclib_answers(
    client_coalesces: bool, server_coalesces: bool
) -> None:
    plain_server, plain_port = await _serve(coalesce=False)
    server, port = await _serve(coalesce=server_coalesces)
    plain = Channel("127.0.0.1", plain_port)
    channel = (CoalescingChannel if client_coalesces else Channel)("127.0.0.1", port)
    try:
        async with asyncio.timeout(120):
            expected = await _calls(plain)
            got = await _calls(channel)
        assert expected[0] == f"{BIG + 2} c-0"
        assert expected[6] == [f"w0-{n} {n}:u {BIG // 8 + 2}" for n in range(6)]
        assert got == expected
    finally:
        plain.close()
        channel.close()
        for s in (plain_server, server):
            s.close()
            await s.wait_closed()
