"""The client's channels over a connection that keepalive gave up: grpclib closes
its transport at once (``Connection.close``, what its ping-timeout timer calls) but
marks the connection lost only when asyncio reports the close, a loop iteration
later. A call made in between must dial again, not fail inside grpclib. And if
something unexpected fails a watch all the same, its waiter hears of it, and
nothing else prints it. A lone task's Watch opens at once even beside a stream
that is still closing. A connection lost as soon as it was made, or under a call
waiting to send, is a transport error, not grpclib's AttributeError."""

from __future__ import annotations

import asyncio
import gc
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import grpclib.const
import grpclib.server
import pytest
from grpclib.client import Channel as GrpclibChannel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.service import Health
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.protocol import H2Protocol
from grpclib.server import Server
from lost_connections import ClosedUnderTheCall
from support import free_port

from blockx_client import RetryPolicy
from blockx_client._convert import update_from_pb
from blockx_client._options import ClientOptions
from blockx_client._watch import WatchBatcher
from blockx_client._worker_rpc import WorkerRpc
from blockx_client.errors import ConnectError
from blockx_client.models import TaskState, TaskUpdate
from blockx_client.transport import Transport, keepalive_config
from blockx_proto import worker_v1
from blockx_proto.channel import PASS_THROUGH_DETAILS, Channel, lost_connection
from blockx_server.proxy.codec import PASS_THROUGH


@pytest.fixture
async def server() -> AsyncIterator[str]:
    serving = Server([Health()])
    port = free_port()
    await serving.start("127.0.0.1", port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        serving.close()
        await serving.wait_closed()


async def _check(channel: GrpclibChannel) -> int:
    reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=5)
    return int(reply.status)


def _give_up_the_connection(channel: GrpclibChannel) -> None:
    """What grpclib's keepalive does when a ping goes unanswered for its timeout."""
    protocol = channel._protocol
    assert protocol is not None
    protocol.connection.close()


async def test_a_call_right_after_keepalive_closed_the_connection_dials_again(
    server: str,
) -> None:
    transport = Transport()
    channel = transport.channel(server)
    try:
        assert await _check(channel) == HealthCheckResponse.SERVING
        first = channel._protocol
        _give_up_the_connection(channel)
        assert await _check(channel) == HealthCheckResponse.SERVING  # no await in between
        assert channel._protocol is not first
    finally:
        transport.close()


async def test_grpclibs_own_channel_fails_there(server: str) -> None:
    """Why the client has its own channel class: grpclib's fails in that window,
    with the error ``lost_connection`` recognises (and no other)."""
    host, port = server.rsplit(":", 1)
    channel = GrpclibChannel(host, int(port), config=keepalive_config(5.0))
    try:
        await _check(channel)
        _give_up_the_connection(channel)
        with pytest.raises(AttributeError, match="_transport") as raised:
            await _check(channel)
        assert lost_connection(raised.value)
    finally:
        channel.close()
    with pytest.raises(AttributeError) as other:
        channel.no_such_attribute  # type: ignore[attr-defined]  # noqa: B018
    assert not lost_connection(other.value)


def _lost_at_once(base: type[GrpclibChannel]) -> type[GrpclibChannel]:
    """A channel of ``base`` whose connections are lost as soon as they are made, as
    with a peer that accepts and goes away before the call's turn comes."""

    class LostAtOnce(base):  # type: ignore[valid-type,misc]
        async def _create_connection(self) -> H2Protocol:
            protocol: H2Protocol = await super()._create_connection()
            protocol.connection_lost(None)  # what asyncio then reports
            return protocol

    return LostAtOnce


async def test_a_connection_lost_as_soon_as_it_was_made_is_a_refused_dial(server: str) -> None:
    host, port = server.rsplit(":", 1)
    grpclibs = _lost_at_once(GrpclibChannel)(host, int(port))
    ours = _lost_at_once(Channel)(host, int(port))
    try:
        with pytest.raises(AttributeError, match="_transport"):
            await _check(grpclibs)
        with pytest.raises(ConnectionError, match="closed as soon as it was made"):
            await _check(ours)
    finally:
        grpclibs.close()
        ours.close()


@pytest.fixture
def cut_off(server: str) -> Iterator[Transport]:
    """A client transport whose channel to ``server`` loses its connection under
    every call, before the request is sent."""
    transport = Transport()
    host, port = server.rsplit(":", 1)
    transport._channels[server] = ClosedUnderTheCall(host, int(port))
    yield transport
    transport.close()


async def test_a_call_cut_off_inside_grpclib_is_a_lost_connection(
    server: str, cut_off: Transport
) -> None:
    with pytest.raises(ConnectError) as raised:
        await cut_off.unary(server, _check(cut_off.channel(server)))
    assert raised.value.may_have_reached  # it cannot tell whether the request left
    assert str(raised.value.message).startswith(f"lost the connection to {server}")
    with pytest.raises(AttributeError, match="a bug"):
        await cut_off.unary(server, _raises(AttributeError("a bug")))


async def test_a_watch_cut_off_inside_grpclib_is_a_lost_connection(
    server: str, cut_off: Transport
) -> None:
    workers = WorkerRpc(_options(5.0), cut_off)
    with pytest.raises(ConnectError) as raised:
        async for _ in workers.watch_tasks(["t-1"], worker_addr=server):
            pass
    assert raised.value.may_have_reached
    assert raised.value.message.startswith(f"lost the connection to the Watch stream to {server}")


async def _raises(exc: BaseException) -> None:
    raise exc


def _options(rpc_timeout_s: float) -> ClientOptions:
    """A client's options for a WatchBatcher alone (no coordinator is dialled)."""
    return ClientOptions(
        coordinator="127.0.0.1:1",
        bundle_coordinator=None,
        sync_invoker="127.0.0.1:1",
        retry=RetryPolicy(),
        rpc_timeout_s=rpc_timeout_s,
    )


class _BrokenWorkers:
    """A WorkerRpc whose watch fails the way a bug in the client would."""

    def watch_tasks(self, task_ids: list[str], **_: object) -> AsyncIterator[object]:
        raise RuntimeError("a bug in the client")


async def test_a_bug_in_a_watch_reaches_its_waiter_and_nothing_else() -> None:
    """The waiter raises it; no task is left with an exception nobody retrieved,
    which asyncio would print to a CLI's user as a traceback."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    batcher = WatchBatcher(_BrokenWorkers(), _options(1.0), "127.0.0.1:2", random.Random(1))  # type: ignore[arg-type]
    try:
        with pytest.raises(RuntimeError, match="a bug in the client"):
            await batcher.wait("t-1")
        await asyncio.sleep(0)  # the watching task ends
        gc.collect()  # where asyncio reports an exception never retrieved
    finally:
        loop.set_exception_handler(None)
    assert unhandled == []


class _SlowToCloseWorkers:
    """A WorkerRpc whose Watch streams send every task's terminal update at once,
    then stay open until ``release`` is set, as a stream waiting for its trailers."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.opened: list[list[str]] = []

    async def watch_tasks(self, task_ids: list[str], **_: object) -> AsyncIterator[TaskUpdate]:
        self.opened.append(list(task_ids))
        for task_id in task_ids:
            yield update_from_pb(
                worker_v1.TaskUpdate(
                    task_id=task_id,
                    state=worker_v1.TaskState.SUCCEEDED,
                    is_terminal=True,
                    result=worker_v1.TaskResult(success=True),
                )
            )
        await self.release.wait()


async def test_a_lone_task_beside_a_closing_stream_does_not_wait_for_the_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The linger that lets task_ids share a stream applies only while a stream still
    # waits for a task: one whose tasks have all ended, not yet closed, is closing.
    monkeypatch.setattr(WatchBatcher, "LINGER_S", 3600.0)
    workers = _SlowToCloseWorkers()
    batcher = WatchBatcher(workers, _options(30.0), "127.0.0.1:2", random.Random(1))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(30):
            first = await batcher.wait("t-1")
            second = await batcher.wait("t-2")  # t-1's stream is still open
        assert (first.task_id, first.state) == ("t-1", TaskState.SUCCEEDED)
        assert (second.task_id, second.state) == ("t-2", TaskState.SUCCEEDED)
        assert workers.opened == [["t-1"], ["t-2"]]
    finally:
        workers.release.set()
        await batcher.close()


class _Failing:
    """One unary method, ``/t.T/Fail``, failing NOT_FOUND with raw error details."""

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        async def fail(stream: grpclib.server.Stream[bytes, bytes]) -> None:
            await stream.recv_message()
            raise GRPCError(Status.NOT_FOUND, "no such thing", details=b"\x08\x05raw")

        return {
            "/t.T/Fail": grpclib.const.Handler(
                fail, grpclib.const.Cardinality.UNARY_UNARY, bytes, bytes
            )
        }


async def test_error_details_reach_the_caller_as_the_bytes_that_came() -> None:
    serving = Server([_Failing()], codec=PASS_THROUGH, status_details_codec=PASS_THROUGH_DETAILS)
    port = free_port()
    await serving.start("127.0.0.1", port)
    channel = Channel("127.0.0.1", port, codec=PASS_THROUGH)
    try:
        method = channel.request("/t.T/Fail", grpclib.const.Cardinality.UNARY_UNARY, bytes, bytes)
        async with method as stream:
            await stream.send_message(b"", end=True)
            with pytest.raises(GRPCError) as raised:
                await stream.recv_message()
    finally:
        channel.close()
        serving.close()
        await serving.wait_closed()
    assert raised.value.status is Status.NOT_FOUND
    assert raised.value.message == "no such thing"
    assert raised.value.details == b"\x08\x05raw"


@pytest.mark.parametrize(
    ("channel", "imported"),
    [("blockx_proto.channel.Channel", False), ("grpclib.client.Channel", True)],
)
def test_a_channel_leaves_protobufs_status_module_unloaded(channel: str, imported: bool) -> None:
    """grpclib's own channel imports google.rpc.status_pb2 (protobuf) when it is made;
    the client's does not, so a command-line client never loads protobuf."""
    module, _, name = channel.rpartition(".")
    probe = (
        "import sys\n"
        f"from {module} import {name}\n"
        f"{name}('127.0.0.1', 1)\n"
        "print('google.rpc.status_pb2' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(imported)
