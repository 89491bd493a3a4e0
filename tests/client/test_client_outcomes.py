"""How the client classifies failures into back-off and outcomes: connect errors,
the retry schedule, the client's own failure codes, routing to the two clusters,
and how a Watch stream's end is told from a lost worker. The peers here are
scripted gRPC servers on real sockets: the tests are about the client's side."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server
from support import free_port

from blockx_client import (
    Backoff,
    BlockxError,
    Client,
    ClientFailureCode,
    ConnectError,
    CoordinatorUnreachableError,
    InvalidRequestError,
    NoSlotError,
    PluginConfig,
    RetryPolicy,
    SlotInvalidError,
    SlotUncertainError,
    SlotWait,
    SubmitUncertainError,
    Task,
    TaskState,
    UnavailableError,
    listen_to_placement,
)
from blockx_client._outcomes import outcome_of_error
from blockx_client.errors import error_for
from blockx_client.transport import connect_error
from blockx_core.failures import FailureCode
from blockx_proto import bundlecoordinator_v1, coordinator_v1, worker_v1

# ---- connect errors --------------------------------------------------------------------

CONNECT_CASES = [
    # (what the transport raised, may the request have reached the server, wording)
    (ConnectionRefusedError(111, "Connect call failed"), False, "cannot reach"),
    (socket.gaierror(-2, "Name or service not known"), False, "cannot reach"),
    (OSError("Multiple exceptions: [Errno 111] ..."), False, "cannot reach"),
    (ConnectionResetError(104, "Connection reset by peer"), True, "lost the connection to"),
    (BrokenPipeError(32, "Broken pipe"), True, "lost the connection to"),
    (StreamTerminatedError("Connection lost"), True, "lost the connection to"),
    (TimeoutError(), True, "lost the connection to"),
]


@pytest.mark.parametrize(("exc", "reached", "words"), CONNECT_CASES)
def test_connect_errors_say_whether_the_request_can_have_arrived(
    exc: BaseException, reached: bool, words: str
) -> None:
    error = connect_error("127.0.0.1:9", exc)
    assert isinstance(error, ConnectError)
    assert error.may_have_reached is reached
    assert error.message.startswith(f"{words} 127.0.0.1:9: ")


def test_unavailable_is_retried_at_once_then_with_back_off() -> None:
    policy = RetryPolicy()
    rng = random.Random(1)
    assert policy.unavailable_delay(1, rng.random()) == 0.0
    for attempt in range(2, 12):
        cap = min(
            policy.unavailable.max_s,
            policy.unavailable.initial_s * policy.unavailable.multiplier ** (attempt - 2),
        )
        # Equal jitter: at least half the ceiling, never the whole of it.
        assert cap / 2 <= policy.unavailable_delay(attempt, rng.random()) < cap


# ---- the client's own outcomes ----------------------------------------------------------

OUTCOME_CASES: list[tuple[BlockxError, ClientFailureCode, bool, bool]] = [
    # (what placement raised, code, retryable, may_have_run)
    (NoSlotError("no slot", Status.RESOURCE_EXHAUSTED), ClientFailureCode.NO_SLOT, True, False),
    (
        CoordinatorUnreachableError("coordinator unreachable", may_have_reached=False),
        ClientFailureCode.COORDINATOR_UNREACHABLE,
        True,
        False,
    ),
    (
        UnavailableError("not ready", Status.UNAVAILABLE),
        ClientFailureCode.COORDINATOR_UNAVAILABLE,
        True,
        False,
    ),
    (
        SlotUncertainError("uncertain", Status.ABORTED),
        ClientFailureCode.SLOT_UNCERTAIN,
        True,
        False,
    ),
    (
        SlotInvalidError("expired", Status.FAILED_PRECONDITION),
        ClientFailureCode.SLOT_INVALID,
        True,
        False,
    ),
    (
        InvalidRequestError("bad config", Status.INVALID_ARGUMENT),
        ClientFailureCode.INVALID_ARGUMENT,
        False,
        False,
    ),
    (
        ConnectError("cannot reach w:1", may_have_reached=False),
        ClientFailureCode.WORKER_LOST,
        True,
        False,
    ),
    (SubmitUncertainError("reset", "w:1"), ClientFailureCode.WORKER_LOST, True, True),
    (
        BlockxError("INTERNAL: boom", Status.INTERNAL),
        ClientFailureCode.PLACEMENT_FAILED,
        True,
        False,
    ),
    (
        BlockxError("UNIMPLEMENTED: no such service", Status.UNIMPLEMENTED),
        ClientFailureCode.PLACEMENT_FAILED,
        False,
        False,
    ),
]


@pytest.mark.parametrize(("exc", "code", "retryable", "may_have_run"), OUTCOME_CASES)
def test_every_placement_failure_is_a_result_with_a_code(
    exc: BlockxError, code: ClientFailureCode, retryable: bool, may_have_run: bool
) -> None:
    result = outcome_of_error("t-1", exc)
    assert result.task_id == "t-1"
    assert result.state is TaskState.FAILED
    assert not result.ok
    assert (result.failure_code, result.retryable, result.may_have_run) == (
        code,
        retryable,
        may_have_run,
    )
    assert exc.message in result.failure_message


def test_client_codes_never_collide_with_the_workers() -> None:
    assert not {c.value for c in ClientFailureCode} & {c.value for c in FailureCode}


# ---- scripted peers ---------------------------------------------------------------------


async def serve(*services: Any, port: int | None = None) -> tuple[Server, str]:
    server = Server(list(services))
    port = port or free_port()
    await server.start("127.0.0.1", port)
    return server, f"127.0.0.1:{port}"


class Recorder(coordinator_v1.CoordinatorServiceBase):
    """A block coordinator that grants one slot on ``w:1`` (or refuses with a status)."""

    def __init__(self, refuse: Status | None = None) -> None:
        self.refuse = refuse
        self.seen: list[str] = []

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        self.seen.append(message.task_id)
        if self.refuse is not None:
            raise GRPCError(self.refuse, "scripted")
        return coordinator_v1.ReserveWorkerSlotResponse(
            task_id=message.task_id, worker_addr="w:1", slot_id="s1"
        )


class BundleRecorder(bundlecoordinator_v1.BundleCoordinatorServiceBase):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def reserve_worker_slot(
        self, message: bundlecoordinator_v1.ReserveWorkerSlotRequest
    ) -> bundlecoordinator_v1.ReserveWorkerSlotResponse:
        self.seen.append(message.task_id)
        raise GRPCError(Status.INVALID_ARGUMENT, "scripted: stop here")


async def test_a_refused_coordinator_is_retried_until_it_comes_up() -> None:
    port = free_port()
    fake = Recorder()

    async def start_later() -> Server:
        await asyncio.sleep(0.5)  # the client meets refused connections meanwhile
        server, _ = await serve(fake, port=port)
        return server

    starting = asyncio.create_task(start_later())
    async with Client(coordinator=f"127.0.0.1:{port}") as client:
        reservation = await client.reserve_worker_slot("t-later", deadline_s=20)
    (await starting).close()
    assert (reservation.worker_addr, reservation.slot_id) == ("w:1", "s1")
    assert fake.seen == ["t-later"]


async def test_an_unreachable_coordinator_says_where_and_for_how_long() -> None:
    addr = f"127.0.0.1:{free_port()}"
    async with Client(coordinator=addr) as client:
        with pytest.raises(CoordinatorUnreachableError) as caught:
            await client.reserve_worker_slot("t-nowhere", deadline_s=0.6)
    message = caught.value.message
    assert message.startswith(f"block coordinator unreachable at {addr} for ")
    assert "attempts; last: cannot reach" in message


class RefusesThenHangs(coordinator_v1.CoordinatorServiceBase):
    """A block coordinator that answers "no slot" once, then never answers again."""

    def __init__(self) -> None:
        self.seen = 0

    async def reserve_worker_slot(
        self, message: coordinator_v1.ReserveWorkerSlotRequest
    ) -> coordinator_v1.ReserveWorkerSlotResponse:
        self.seen += 1
        if self.seen == 1:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "no worker has a free slot")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_attempt_cut_by_the_deadline_reports_the_last_refusal() -> None:
    """The deadline ending an attempt in flight is not a coordinator that stopped
    answering: the caller hears the "no slot" it was last told."""
    fake = RefusesThenHangs()
    server, addr = await serve(fake)
    try:
        policy = RetryPolicy(no_slot=Backoff(initial_s=0.01, max_s=0.01))
        async with Client(coordinator=addr, retry=policy) as client:
            with pytest.raises(NoSlotError) as caught:
                await client.reserve_worker_slot("t-cut", deadline_s=0.5)
    finally:
        server.close()
    assert fake.seen == 2
    message = caught.value.message
    assert message.startswith("timed out waiting for a slot for task t-cut")
    assert "(2 attempts; last: RESOURCE_EXHAUSTED: no worker has a free slot)" in message


class _ListensAtTheFirstWait:
    """A placement listener that makes the refused address a listening socket (that
    never answers) while the client backs off from its first refusal."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.waits: list[SlotWait] = []

    def waiting(self, wait: SlotWait) -> None:
        self.waits.append(wait)
        if len(self.waits) == 1:
            self.sock.listen()

    def done(self) -> None:
        pass


async def test_an_attempt_cut_by_the_deadline_after_refusals_reports_unreachable() -> None:
    """Refused, then connected but never answered until the deadline: the caller hears
    that the coordinator could not be reached, not that no worker is live."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{sock.getsockname()[1]}"
        listener = _ListensAtTheFirstWait(sock)
        async with Client(coordinator=addr) as client:
            with (
                listen_to_placement(listener),
                pytest.raises(CoordinatorUnreachableError) as caught,
            ):
                await client.reserve_worker_slot("t-cut", deadline_s=2.0)
    assert [type(w.error) for w in listener.waits] == [ConnectError]  # refused, once
    message = caught.value.message
    assert message.startswith(f"block coordinator unreachable at {addr} for ")
    assert "(1 attempts; last: cannot reach" in message


def _task(builder: str, handler: str | None, task_id: str) -> Task:
    return Task(
        function_call_config=PluginConfig(type=builder, config={"function": "f"}),
        result_handler=PluginConfig(type=handler) if handler else None,
        task_id=task_id,
    )


async def test_tasks_go_to_the_coordinator_of_their_cluster() -> None:
    block, bundle = Recorder(refuse=Status.INVALID_ARGUMENT), BundleRecorder()
    block_server, block_addr = await serve(block)
    bundle_server, bundle_addr = await serve(bundle)
    tasks = [
        _task("BlockTableCallConfig", "BlockWriteResultHandler", "table"),
        _task("BlockBundleCallConfig", "BlockBundleWriteResultHandler", "bundle"),
        _task("BlockBundleCallConfig", "ReturnValueResultHandler", "bundle-returned"),
        _task("InputsCallConfig", None, "inputs"),
        _task("CallListCallConfig", "ReturnValueResultHandler", "call-list"),
    ]
    try:
        async with Client(coordinator=block_addr, bundle_coordinator=bundle_addr) as client:
            results = [r async for r in client.run_many(tasks)]
    finally:
        block_server.close()
        bundle_server.close()
    assert sorted(block.seen) == ["bundle-returned", "call-list", "table"]
    assert sorted(bundle.seen) == ["bundle", "inputs"]
    assert {r.failure_code for r in results} == {ClientFailureCode.INVALID_ARGUMENT}


async def test_a_bundle_task_without_a_bundle_coordinator_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BLOCKX_BUNDLE_COORDINATOR", raising=False)
    monkeypatch.delenv("PROXY_SOCKET_PATH", raising=False)
    task = _task("BlockBundleCallConfig", "BlockBundleWriteResultHandler", "t-bundle")
    async with Client(coordinator=f"127.0.0.1:{free_port()}") as client:
        assert client.bundle_coordinator is None
        with pytest.raises(InvalidRequestError) as caught:
            await client.run(task)
        results = [r async for r in client.run_many([task])]
        attempts = await client.run_with_retries(task, max_attempts=3)
    for words in ("bundle cluster", "bundle_coordinator=", "BLOCKX_BUNDLE_COORDINATOR"):
        assert words in caught.value.message
    [result] = results
    assert (result.failure_code, result.retryable) == (ClientFailureCode.INVALID_ARGUMENT, False)
    assert "BLOCKX_BUNDLE_COORDINATOR" in result.failure_message
    assert [a.failure_code for a in attempts] == [ClientFailureCode.INVALID_ARGUMENT]


class ScriptedWorker(worker_v1.WorkerServiceBase):
    """Accepts every SubmitTask, then plays a script: ``cut`` breaks the first Watch
    stream of a task that is still running and finishes it on the next; ``forget``
    answers as a restarted worker that never heard of the task; ``slow-submit``
    answers SubmitTask too late, and the task then succeeds."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.watches = 0
        self.lookups = 0

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        assert message.task is not None
        if self.script == "slow-submit":
            await asyncio.sleep(1.0)  # accepted, but the answer comes after the caller gave up
        return worker_v1.SubmitTaskResponse(
            task_id=message.task.task_id, state=worker_v1.TaskState.RUNNING
        )

    async def get_task_result(
        self, message: worker_v1.GetTaskResultRequest
    ) -> worker_v1.GetTaskResultResponse:
        self.lookups += 1
        if self.script == "forget":
            raise GRPCError(Status.NOT_FOUND, "not_found")
        return worker_v1.GetTaskResultResponse(
            task_id=message.task_id, state=worker_v1.TaskState.RUNNING
        )

    async def watch_tasks(
        self, message: worker_v1.WatchTasksRequest
    ) -> AsyncIterator[worker_v1.TaskUpdate]:
        self.watches += 1
        for task_id in message.task_ids:
            if self.script == "forget":
                yield worker_v1.TaskUpdate(task_id=task_id, is_terminal=True, error="not_found")
            elif self.watches == 1:
                yield worker_v1.TaskUpdate(task_id=task_id, state=worker_v1.TaskState.RUNNING)
                raise GRPCError(Status.UNAVAILABLE, "scripted: the stream breaks")
            else:
                yield worker_v1.TaskUpdate(
                    task_id=task_id,
                    state=worker_v1.TaskState.SUCCEEDED,
                    is_terminal=True,
                    result=worker_v1.TaskResult(
                        success=True, execute_result=worker_v1.ExecuteResult()
                    ),
                )


async def test_a_cut_stream_on_a_live_worker_is_watched_again() -> None:
    worker = ScriptedWorker("cut")
    server, addr = await serve(worker)
    try:
        async with Client() as client:
            result = await client.run(Task.call_list("f", [[1]]), worker_addr=addr)
    finally:
        server.close()
    assert result.state is TaskState.SUCCEEDED
    assert (worker.watches, worker.lookups) == (2, 1)


async def test_a_worker_that_forgot_the_task_makes_it_worker_lost() -> None:
    worker = ScriptedWorker("forget")
    server, addr = await serve(worker)
    try:
        async with Client() as client:
            result = await client.run(
                Task.call_list("f", [[1]], task_id="t-forgot"), worker_addr=addr
            )
            attempts = await client.run_with_retries(
                Task.call_list("f", [[1]], task_id="t-lost"), worker_addr=addr, max_attempts=2
            )
    finally:
        server.close()
    assert result.state is TaskState.FAILED
    assert (result.failure_code, result.retryable, result.may_have_run) == (
        ClientFailureCode.WORKER_LOST,
        True,
        True,
    )
    assert result.worker_addr == addr
    assert "no longer knows the task" in result.failure_message
    # WORKER_LOST is retried under a new task_id.
    assert [a.task_id for a in attempts] == ["t-lost", "t-lost.retry-2"]
    assert all(a.failure_code == ClientFailureCode.WORKER_LOST for a in attempts)


async def test_a_worker_that_stays_unreachable_makes_its_tasks_worker_lost() -> None:
    worker = ScriptedWorker("cut")
    server, addr = await serve(worker)
    async with Client() as placer:
        placed = await placer.place(Task.call_list("f", [[1]], task_id="t-gone"), worker_addr=addr)
    server.close()
    await server.wait_closed()
    # The worker is gone: a client waiting for the task cannot reach it (the watcher
    # is what ``run`` waits on once SubmitTask was accepted).
    async with Client(retry=RetryPolicy(worker_unreachable_s=0.5)) as client:
        result = await client._watchers.wait(placed.task_id, worker_addr=addr)
    assert (result.failure_code, result.retryable, result.may_have_run) == (
        ClientFailureCode.WORKER_LOST,
        True,
        True,
    )
    assert "unreachable for" in result.failure_message


async def test_run_many_reports_a_client_bug_as_an_outcome_too() -> None:
    fake = Recorder()
    server, addr = await serve(fake)
    # A config json cannot encode: SubmitTask is never sent.
    broken = Task(
        function_call_config=PluginConfig(type="CallListCallConfig", config={"x": object()}),
        task_id="t-broken",
    )
    try:
        async with Client(coordinator=addr) as client:
            [result] = [r async for r in client.run_many([broken])]
    finally:
        server.close()
    assert (result.task_id, result.failure_code, result.retryable) == (
        "t-broken",
        ClientFailureCode.PLACEMENT_FAILED,
        False,
    )
    assert result.failure_message.startswith("the client failed: TypeError")


async def test_a_submit_without_an_answer_is_settled_by_asking_the_worker() -> None:
    worker = ScriptedWorker("slow-submit")
    worker.watches = 1  # straight to the terminal update
    server, addr = await serve(worker)
    try:
        async with Client(rpc_timeout_s=0.2) as client:
            with pytest.raises(SubmitUncertainError, match="may have been accepted"):
                await client.place(Task.call_list("f", [[1]], task_id="t-slow-1"), worker_addr=addr)
            result = await client.run(
                Task.call_list("f", [[1]], task_id="t-slow-2"), worker_addr=addr
            )
    finally:
        server.close()
    # The worker had the task: its answer is the result, not a guess.
    assert result.state is TaskState.SUCCEEDED
    assert result.may_have_run


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (Status.RESOURCE_EXHAUSTED, NoSlotError),
        (Status.UNAVAILABLE, UnavailableError),
        # A server that enforced the call's deadline before the client's own timer
        # fired: the same as that timer (a retry, or the deadline's last refusal).
        (Status.DEADLINE_EXCEEDED, UnavailableError),
        (Status.INTERNAL, BlockxError),
    ],
)
def test_a_status_becomes_the_error_its_caller_handles(status: Status, kind: type) -> None:
    error = error_for(status, "said")
    assert type(error) is kind
    assert error.status is status
    assert error.message == f"{status.name}: said"
