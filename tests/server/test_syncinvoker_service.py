"""The Sync Invoker in-process: ``serve()`` on a real socket, real executor processes,
a real FUNCTIONS_DIR in a temporary directory, and a grpclib client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from support import free_port, wait_until

from blockx_core.call_record import RecordedIo, decode_record
from blockx_core.calls import RootOutput
from blockx_core.dispatch import CallFailure, CallsConverged, CallsFailed, ConvergeTaskCalls
from blockx_core.failures import CallFailureKind, Failure, FailureCode, is_retryable
from blockx_proto import syncinvoker_v1 as pb
from blockx_server.syncinvoker.app import serve
from blockx_server.syncinvoker.config import load_syncinvoker_config
from blockx_server.syncinvoker.outcome import InvokeFailed, InvokeSucceeded
from blockx_server.syncinvoker.service import (
    InvokeObserver,
    InvokeOutcome,
    invoke_outcome,
)

FUNCTIONS = '''
import logging
import time

from blockx_executor import CallError, IoError, call, io

log = logging.getLogger("fns")


def greet(name, count=1):
    return ", ".join([f"hello {name}"] * count)


def busy(ms):
    """Burn ``ms`` of this thread's CPU time (what the budget counts)."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass
    return ms


def spin():
    while True:
        pass


def boom(x):
    raise ValueError(f"bad input {x}")


async def total(prefix):
    keys = await io.memory.keys(prefix)
    return sum(await io.memory.mget(keys))


async def writes():
    await io.memory.put("k", 1)


async def writes_and_swallows():
    try:
        await io.memory.put("k", 1)
    except IoError:
        return "swallowed"


def double(x):
    return 2 * x


async def doubled(x):
    return {"x": x, "double": await call("double", x)}


async def calls_boom():
    try:
        await call("boom", 7)
    except CallError as exc:
        return exc.kind


async def chatty(x):
    print(f"printing {x}")
    log.info("logging %s", x)
    answer = await io.memory.get("answer")
    try:
        await io.memory.no_such_op()
    except IoError:
        pass
    return answer


async def gated(x):
    return await io.gate.wait(x)


async def reads_nowhere():
    return await io.nowhere.get("k")


async def reads_badly():
    return await io.memory.get()


async def reads_with_default(key):
    return await io.memory.get(key, default=7)


async def answer_plus(x):
    return await io.memory.get("answer") + x


async def nested(x):
    own = await io.memory.get("n:0001")
    return {"own": own, "sub": await call("answer_plus", x)}


async def reads_then_fails(key):
    value = await io.memory.get(key)
    raise ValueError(f"cannot use {value}")
'''

# Precheck must never run any of these.
SIGNATURES = """
def decorate(f):
    return f


def positional(a, b=2, /, c=3, *rest, key, flag=False, **extra) -> dict:
    raise RuntimeError("precheck ran positional")


def named(name: str, count: int = 1):
    raise RuntimeError("precheck ran named")


async def fetch_block(number, *, full=False):
    raise RuntimeError("precheck ran fetch_block")


@decorate
def decorated(x):
    return x
"""

EXPLODES = """
raise RuntimeError("the top level of explodes.py ran")


def never_imported(x):
    return x
"""

BROKEN = """
def broken_fn(x:
    return x
"""

SEED = {"answer": 42, **{f"n:{i:04d}": i for i in range(2000)}}


class Gate:
    """``io.gate.wait(x)``: every read waits until the test opens the gate."""

    name = "gate"
    read_ops = frozenset({"wait"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.waiting = 0
        self.opened = asyncio.Event()

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.waiting += 1
        try:
            await self.opened.wait()
        finally:
            self.waiting -= 1
        return args[0]


class Invoker:
    """One in-process Sync Invoker and a client connected to it."""

    def __init__(
        self,
        port: int,
        functions: Path,
        gate: Gate,
        stop: asyncio.Event,
        task: asyncio.Task[None],
    ) -> None:
        self.port = port
        self.stop = stop
        self.functions = functions
        self.gate = gate
        self.task = task
        self.channel = Channel("127.0.0.1", port)
        self.stub = pb.SyncInvokerServiceStub(self.channel)

    async def invoke(
        self, function: str, *args: Any, timeout_ms: int = 0, call_id: str = ""
    ) -> pb.InvokeResponse:
        return await self.stub.invoke(
            pb.InvokeRequest(
                function=function, args=json.dumps(args), timeout_ms=timeout_ms, call_id=call_id
            ),
            timeout=30,
        )

    async def debug_invoke(self, function: str, *args: Any) -> pb.DebugInvokeResponse:
        return await self.stub.debug_invoke(
            pb.DebugInvokeRequest(function=function, args=json.dumps(args)), timeout=30
        )

    async def precheck(self, function: str, args: str = "") -> pb.PrecheckResponse:
        return await self.stub.precheck(
            pb.PrecheckRequest(function=function, args=args), timeout=30
        )

    async def health(self) -> int:
        response = await HealthStub(self.channel).Check(
            HealthCheckRequest(service="syncinvoker.v1.SyncInvokerService"), timeout=5
        )
        status: int = response.status
        return status

    async def wait_serving(self) -> None:
        async def serving() -> bool:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise AssertionError("serve() returned before it was ready")
            try:
                return await self.health() == HealthCheckResponse.SERVING
            except (OSError, GRPCError, TimeoutError):
                return False

        await wait_until(serving, "the Sync Invoker serving", timeout=30)


StartInvoker = Callable[..., Awaitable[Invoker]]


@pytest.fixture
async def start_invoker(tmp_path: Path) -> AsyncIterator[StartInvoker]:
    started: list[Invoker] = []

    async def start(wait: bool = True, **env: str) -> Invoker:
        functions = tmp_path / f"functions-{len(started)}"
        functions.mkdir()
        (functions / "fns.py").write_text(FUNCTIONS)
        (functions / "signatures.py").write_text(SIGNATURES)
        (functions / "explodes.py").write_text(EXPLODES)
        (functions / "broken.py").write_text(BROKEN)
        seed = tmp_path / "seed.json"
        seed.write_text(json.dumps(SEED))
        port = free_port()
        config = load_syncinvoker_config(
            {
                "SYNC_INVOKER_LISTEN": f"127.0.0.1:{port}",
                "FUNCTIONS_DIR": str(functions),
                "FUNCTIONS_POLL_INTERVAL_MS": "50",
                "IO_MEMORY_SEED_FILE": str(seed),
                "EXECUTOR_COUNT": "2",
                "EXECUTOR_HEARTBEAT_INTERVAL_MS": "50",
                "DRAIN_TIMEOUT_MS": "10000",
                **env,
            }
        )
        gate = Gate()
        stop = asyncio.Event()
        task = asyncio.create_task(serve(config, stop=stop, backends=[gate]))
        invoker = Invoker(port, functions, gate, stop, task)
        started.append(invoker)
        if wait:
            await invoker.wait_serving()
        return invoker

    yield start
    for invoker in started:
        invoker.stop.set()
        invoker.gate.opened.set()
        invoker.channel.close()
        async with asyncio.timeout(30):
            await invoker.task


@pytest.fixture
async def invoker(start_invoker: StartInvoker) -> Invoker:
    return await start_invoker()


def durations(response: pb.InvokeResponse) -> pb.CallDurations:
    assert response.durations is not None
    return response.durations


def inner(debug: pb.DebugInvokeResponse) -> pb.InvokeResponse:
    assert debug.response is not None
    return debug.response


def result(response: pb.InvokeResponse) -> Any:
    assert response.success, f"{response.failure_code}: {response.failure_message}"
    return json.loads(response.result)


# ---- Invoke ---------------------------------------------------------------------------


async def test_invoke_returns_the_result_call_id_and_epoch(invoker: Invoker) -> None:
    response = await invoker.invoke("greet", "ct2", 2, call_id="my-call")
    assert result(response) == "hello ct2, hello ct2"
    assert response.call_id == "my-call"
    assert response.code_epoch == 1
    assert response.failure_code == ""
    generated = await invoker.invoke("greet", "x")
    assert len(generated.call_id) == 32  # a uuid4 hex when the caller gives none


async def test_cpu_time_is_attributed_to_cpu(invoker: Invoker) -> None:
    response = await invoker.invoke("busy", 30)
    assert result(response) == 30
    d = durations(response)
    assert d.cpu_us >= 30_000, d
    assert d.io_us == 0
    assert d.queue_us >= 0


async def test_io_time_is_attributed_to_io(invoker: Invoker) -> None:
    response = await invoker.invoke("total", "n:")
    assert result(response) == sum(range(2000))
    d = durations(response)
    assert d.io_us > 0, d
    assert d.cpu_us > 0, d
    assert d.queue_us >= 0


async def test_a_user_exception_is_a_normal_answer_with_the_traceback(invoker: Invoker) -> None:
    response = await invoker.invoke("boom", 7)
    assert not response.success
    assert response.failure_code == "USER_ERROR"
    assert response.failure_message.startswith("ValueError: bad input 7\n")
    assert "Traceback (most recent call last)" in response.failure_message
    assert 'in boom\n    raise ValueError(f"bad input {x}")' in response.failure_message
    # The dispatcher's "call #0 boom(7) failed: USER_ERROR:" prefix is gone.
    assert "call #0" not in response.failure_message
    assert not response.retryable
    assert response.result == b""


async def test_arguments_that_look_like_a_failure_do_not_confuse_the_split(
    invoker: Invoker,
) -> None:
    response = await invoker.invoke("boom", ") failed: WRITE_FORBIDDEN: not really")
    assert response.failure_code == "USER_ERROR"
    assert response.failure_message.startswith("ValueError: bad input ) failed: WRITE_FORBIDDEN")


async def test_a_missing_function(invoker: Invoker) -> None:
    response = await invoker.invoke("gret", "x")
    assert not response.success
    assert response.failure_code == "FUNCTION_NOT_FOUND"
    assert "'gret' is not defined in function code epoch 1" in response.failure_message
    assert "Did you mean 'greet'?" in response.failure_message
    assert not response.retryable


async def test_a_write_is_refused_even_when_caught(invoker: Invoker) -> None:
    for function in ("writes", "writes_and_swallows"):
        response = await invoker.invoke(function)
        assert not response.success, function
        assert response.failure_code == "WRITE_FORBIDDEN", function
        assert "io.memory.put is a write" in response.failure_message
        assert not response.retryable


async def test_an_escaped_io_error_is_retryable_only_when_a_retry_may_pass(
    invoker: Invoker,
) -> None:
    # UNKNOWN_BACKEND and BAD_REQUEST fail the same way every time.
    for function, kind in (("reads_nowhere", "UNKNOWN_BACKEND"), ("reads_badly", "BAD_REQUEST")):
        response = await invoker.invoke(function)
        assert response.failure_code == "IO_ERROR", function
        assert f"IoError: {kind}" in response.failure_message, function
        assert not response.retryable, function


async def test_sub_calls_run_inside_an_invoke(invoker: Invoker) -> None:
    assert result(await invoker.invoke("doubled", 21)) == {"x": 21, "double": 42}
    assert result(await invoker.invoke("calls_boom")) == "USER_ERROR"


async def test_a_module_whose_top_level_raises_fails_compile_error(invoker: Invoker) -> None:
    response = await invoker.invoke("never_imported", 1)
    assert response.failure_code == "COMPILE_ERROR"
    assert "the top level of explodes.py ran" in response.failure_message


BAD_REQUESTS = [
    # (function, args, timeout_ms, call_id, words of the message)
    ("", "[]", 0, "", "function is required"),
    ("greet", '{"name": "x"}', 0, "", "got a JSON object"),
    ("greet", '"x"', 0, "", "got a JSON string"),
    ("greet", "[1,", 0, "", "JSON array text"),
    ("greet", "[123456789012345678901234567890]", 0, "", "cannot be passed"),
    ("greet", '["x"]', -1, "", "timeout_ms must be >= 0"),
    ("greet", '["x"]', 60_001, "", "MAX_INVOKE_TIMEOUT_MS"),
    ("greet", '["x"]', 0, "c" * 129, "call_id must be at most 128"),
]


async def test_bad_requests_are_invalid_argument(invoker: Invoker) -> None:
    for function, args, timeout_ms, call_id, words in BAD_REQUESTS:
        request = pb.InvokeRequest(
            function=function, args=args, timeout_ms=timeout_ms, call_id=call_id
        )
        with pytest.raises(GRPCError) as caught:
            await invoker.stub.invoke(request, timeout=10)
        assert caught.value.status is Status.INVALID_ARGUMENT, (function, args)
        assert words in (caught.value.message or ""), (words, caught.value.message)
        with pytest.raises(GRPCError) as debug_caught:
            await invoker.stub.debug_invoke(
                pb.DebugInvokeRequest(
                    function=function, args=args, timeout_ms=timeout_ms, call_id=call_id
                ),
                timeout=10,
            )
        assert debug_caught.value.status is Status.INVALID_ARGUMENT


async def test_empty_args_mean_no_arguments(invoker: Invoker) -> None:
    response = await invoker.stub.invoke(pb.InvokeRequest(function="spin_free"), timeout=10)
    assert response.failure_code == "FUNCTION_NOT_FOUND"
    response = await invoker.stub.invoke(pb.InvokeRequest(function="total"), timeout=10)
    assert response.failure_code == "USER_ERROR"
    assert "missing 1 required positional argument: 'prefix'" in response.failure_message


# ---- budgets --------------------------------------------------------------------------


async def test_budgets(start_invoker: StartInvoker) -> None:
    invoker = await start_invoker(CALL_DEADLINE_MS="300", MAX_INVOKE_TIMEOUT_MS="5000")
    # Code that never ends is stopped at the default budget (CALL_DEADLINE_MS).
    spun = await invoker.invoke("spin")
    assert spun.failure_code == "BUDGET_EXCEEDED", spun.failure_message
    assert "over its budget of 300 ms" in spun.failure_message
    assert "its executor was killed" in spun.failure_message
    assert not spun.retryable
    # A larger timeout_ms, up to MAX_INVOKE_TIMEOUT_MS, is honoured...
    assert result(await invoker.invoke("busy", 600, timeout_ms=3000)) == 600
    # ...and so is a smaller one, whether a heartbeat or the completion catches it.
    small = await invoker.invoke("busy", 400, timeout_ms=100)
    assert small.failure_code == "BUDGET_EXCEEDED", small.failure_message
    assert "over its budget of 100 ms" in small.failure_message
    with pytest.raises(GRPCError) as caught:
        await invoker.invoke("busy", 1, timeout_ms=5001)
    assert caught.value.status is Status.INVALID_ARGUMENT
    # The killed executors were replaced; the invoker keeps serving.
    assert result(await invoker.invoke("greet", "again")) == "hello again"


async def test_a_runaway_call_of_a_cancelled_invoke_is_still_stopped(
    start_invoker: StartInvoker,
) -> None:
    # One executor: while the abandoned call holds it, nothing else can run.
    invoker = await start_invoker(
        EXECUTOR_COUNT="1", CALL_DEADLINE_MS="300", MAX_INVOKE_TIMEOUT_MS="5000"
    )
    # The client's deadline ends it: locally, or as the server's DEADLINE_EXCEEDED.
    with pytest.raises((TimeoutError, GRPCError)) as gave_up:
        await invoker.stub.invoke(
            pb.InvokeRequest(function="spin", args="[]", timeout_ms=1000), timeout=0.3
        )
    if isinstance(gave_up.value, GRPCError):
        assert gave_up.value.status is Status.DEADLINE_EXCEEDED
    # The dispatcher forgot the call when the invoke was cancelled; its executor is
    # killed at the call's 1000 ms budget all the same, and a new one serves this.
    after = await invoker.invoke("greet", "after")
    assert result(after) == "hello after"


# ---- DebugInvoke ----------------------------------------------------------------------


async def test_debug_invoke_returns_output_and_io_trace(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("chatty", "x")
    assert result(inner(debug)) == 42
    assert "printing x\n" in debug.output
    assert "INFO fns: logging x" in debug.output
    assert [(e.backend, e.op, e.success) for e in debug.io_trace] == [
        ("memory", "get", True),
        ("memory", "no_such_op", False),
    ]
    get, failed = debug.io_trace
    assert json.loads(get.request) == ["answer"]
    assert get.duration_us >= 0
    assert failed.error.startswith("UNKNOWN_OP: io.memory has no operation 'no_such_op'")
    # A plain Invoke of the same function carries neither.
    assert result(await invoker.invoke("chatty", "x")) == 42


async def test_the_io_trace_shows_keyword_arguments(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("reads_with_default", "missing")
    assert result(inner(debug)) == 7
    [get] = debug.io_trace
    assert json.loads(get.request) == {"args": ["missing"], "kwargs": {"default": 7}}


async def test_debug_invoke_of_a_failing_function(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("boom", 1)
    assert inner(debug).failure_code == "USER_ERROR"
    assert debug.io_trace == []


# ---- call records ----------------------------------------------------------------------


async def test_debug_invoke_records_the_call_and_its_sub_calls_io(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("nested", 1)
    assert result(inner(debug)) == {"own": 1, "sub": 43}
    record = decode_record(debug.call_record)
    assert (record.function, record.args, record.chain) == ("nested", [1], "")
    assert record.io == [
        RecordedIo(backend="memory", op="get", args=["n:0001"], answer=1),
        RecordedIo(backend="memory", op="get", args=["answer"], answer=42),
    ]
    assert record.result == {"own": 1, "sub": 43}
    assert record.failure is None
    assert not record.truncated
    assert record.code_epoch == inner(debug).code_epoch
    assert record.code["fns"] == (invoker.functions / "fns.py").read_text()
    assert len(record.code_digest) == 64


async def test_a_call_without_io_has_a_record_too(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("greet", "x")
    record = decode_record(debug.call_record)
    assert (record.function, record.args, record.io, record.result) == (
        "greet",
        ["x"],
        [],
        "hello x",
    )


async def test_the_record_of_a_failed_call_holds_its_traceback(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("reads_then_fails", "answer")
    record = decode_record(debug.call_record)
    assert record.failure is not None
    assert record.failure.kind == CallFailureKind.USER_ERROR
    assert record.failure.message == inner(debug).failure_message
    assert "ValueError: cannot use 42" in record.failure.message
    line = FUNCTIONS.splitlines().index('    raise ValueError(f"cannot use {value}")') + 1
    assert f'fns.py", line {line}, in reads_then_fails' in record.failure.message
    assert record.io == [RecordedIo(backend="memory", op="get", args=["answer"], answer=42)]
    assert record.result is None


async def test_failed_io_is_recorded_with_its_kind(invoker: Invoker) -> None:
    debug = await invoker.debug_invoke("chatty", "x")
    record = decode_record(debug.call_record)
    get, failed = record.io
    assert (get.op, get.answer, get.error) == ("get", 42, None)
    assert failed.op == "no_such_op"
    assert failed.error is not None
    assert failed.error.kind.value == "UNKNOWN_OP"


async def test_a_record_stops_at_call_record_max_bytes(start_invoker: StartInvoker) -> None:
    invoker = await start_invoker(CALL_RECORD_MAX_BYTES="20000")
    debug = await invoker.debug_invoke("total", "n:")
    assert result(inner(debug)) == sum(range(2000))
    record = decode_record(debug.call_record)
    assert record.truncated
    # keys() answers with 2000 keys (about 18,000 bytes); mget's 2000 numbers do not
    # fit in what is left: the record stops there.
    assert [entry.op for entry in record.io] == ["keys"]
    small = decode_record((await invoker.debug_invoke("nested", 2)).call_record)
    assert not small.truncated
    assert len(small.io) == 2


async def test_no_record_when_recording_is_off(start_invoker: StartInvoker) -> None:
    invoker = await start_invoker(CALL_RECORD_MAX_BYTES="0")
    debug = await invoker.debug_invoke("nested", 1)
    assert result(inner(debug)) == {"own": 1, "sub": 43}
    assert debug.call_record == b""


# ---- Precheck -------------------------------------------------------------------------

PRECHECKS = [
    # (function, args, ok, failure_code, signature, is_async, words of the message)
    ("named", "", True, "", "(name: str, count: int = 1)", False, ""),
    ("named", '["x"]', True, "", "(name: str, count: int = 1)", False, ""),
    ("named", '["x", 2]', True, "", "(name: str, count: int = 1)", False, ""),
    (
        "named",
        '["x", 2, 3]',
        False,
        "SIGNATURE_MISMATCH",
        "(name: str, count: int = 1)",
        False,
        "too many positional arguments",
    ),
    (
        "named",
        "[]",
        False,
        "SIGNATURE_MISMATCH",
        "(name: str, count: int = 1)",
        False,
        "missing a required argument: 'name'",
    ),
    (
        "positional",
        "[1, 2, 3, 4, 5]",
        False,
        "SIGNATURE_MISMATCH",
        "(a, b=2, /, c=3, *rest, key, flag=False, **extra) -> dict",
        False,
        "missing a required argument: 'key'",
    ),
    ("fetch_block", "[19000000]", True, "", "(number, *, full=False)", True, ""),
    ("decorated", "[1, 2, 3]", True, "", "(x)", False, "arguments not checked"),
    # Its module's top level raises; Precheck does not import it, so it cannot know.
    ("never_imported", "[1]", True, "", "(x)", False, ""),
    ("missing", "[]", False, "FUNCTION_NOT_FOUND", "", False, "is not defined"),
    ("broken_fn", "[1]", False, "COMPILE_ERROR", "", False, "broken.py does not compile"),
]


async def test_precheck(invoker: Invoker) -> None:
    for function, args, ok, code, signature, is_async, words in PRECHECKS:
        answer = await invoker.precheck(function, args)
        case = (function, args, answer)
        assert answer.ok is ok, case
        assert answer.failure_code == code, case
        assert answer.signature == signature, case
        assert answer.is_async is is_async, case
        assert words in answer.message, case
        assert answer.code_epoch == 1


async def test_precheck_never_runs_user_code(invoker: Invoker) -> None:
    # Each of these raises when run, or when its module is imported: ok proves that
    # Precheck did neither.
    checks = [("named", '["x"]'), ("fetch_block", "[1]"), ("never_imported", "[1]")]
    for function, args in checks:
        assert (await invoker.precheck(function, args)).ok, function
    assert "precheck ran named" in (await invoker.invoke("named", "x")).failure_message
    assert "precheck ran fetch_block" in (await invoker.invoke("fetch_block", 1)).failure_message
    imported = await invoker.invoke("never_imported", 1)
    assert imported.failure_code == "COMPILE_ERROR"


async def test_precheck_refuses_bad_requests(invoker: Invoker) -> None:
    for function, args in [("", ""), ("named", "{}"), ("named", "[")]:
        with pytest.raises(GRPCError) as caught:
            await invoker.precheck(function, args)
        assert caught.value.status is Status.INVALID_ARGUMENT


# ---- capacity, readiness, code updates ------------------------------------------------


async def test_more_invokes_than_the_maximum_are_resource_exhausted(
    start_invoker: StartInvoker,
) -> None:
    invoker = await start_invoker(SYNC_INVOKER_MAX_CONCURRENT="1")
    held = asyncio.create_task(invoker.invoke("gated", "held"))
    await wait_until(lambda: invoker.gate.waiting == 1, "the first invoke waiting at the gate")
    with pytest.raises(GRPCError) as caught:
        await invoker.invoke("greet", "second")
    assert caught.value.status is Status.RESOURCE_EXHAUSTED
    assert "SYNC_INVOKER_MAX_CONCURRENT" in (caught.value.message or "")
    with pytest.raises(GRPCError) as debug_caught:
        await invoker.debug_invoke("greet", "second")
    assert debug_caught.value.status is Status.RESOURCE_EXHAUSTED
    # Precheck runs no code and takes no invoke slot.
    assert (await invoker.precheck("greet", '["x"]')).ok
    invoker.gate.opened.set()
    held_response = await held
    assert result(held_response) == "held"
    assert durations(held_response).io_us > 0  # the time at the gate is IO time
    assert result(await invoker.invoke("greet", "second")) == "hello second"


async def test_not_ready_until_executors_heartbeat(start_invoker: StartInvoker) -> None:
    # Executors that cannot start (1 MiB of address space) never heartbeat.
    invoker = await start_invoker(wait=False, EXECUTOR_MEMORY_LIMIT_BYTES=str(1 << 20))

    async def answers() -> bool:
        try:
            return await invoker.health() == HealthCheckResponse.NOT_SERVING
        except (OSError, GRPCError, TimeoutError):
            return False

    await wait_until(answers, "the health service answering")
    with pytest.raises(GRPCError) as caught:
        await invoker.invoke("greet", "x")
    assert caught.value.status is Status.UNAVAILABLE
    assert "starting" in (caught.value.message or "")
    # The code is loaded, so Precheck already answers.
    assert (await invoker.precheck("greet", '["x"]')).ok


async def test_stopping_finishes_running_invokes_and_refuses_new_ones(
    invoker: Invoker,
) -> None:
    held = asyncio.create_task(invoker.invoke("gated", 1))
    await wait_until(lambda: invoker.gate.waiting == 1, "the invoke waiting at the gate")
    invoker.stop.set()  # what SIGTERM does

    async def not_serving() -> bool:
        return await invoker.health() == HealthCheckResponse.NOT_SERVING

    await wait_until(not_serving, "health NOT_SERVING")
    with pytest.raises(GRPCError) as caught:
        await invoker.invoke("greet", "late")
    assert caught.value.status is Status.UNAVAILABLE
    assert "shutting down" in (caught.value.message or "")
    assert not invoker.task.done()  # still draining the held invoke
    invoker.gate.opened.set()
    assert result(await held) == 1
    async with asyncio.timeout(30):
        await invoker.task


async def test_a_code_update_is_picked_up_without_a_restart(invoker: Invoker) -> None:
    assert (await invoker.invoke("version")).failure_code == "FUNCTION_NOT_FOUND"
    (invoker.functions / "versioned.py").write_text("def version():\n    return 'v2'\n")

    async def epoch_2() -> bool:
        return (await invoker.precheck("version")).code_epoch == 2

    await wait_until(epoch_2, "code epoch 2")
    response = await invoker.invoke("version")
    assert result(response) == "v2"
    assert response.code_epoch == 2
    assert result(await invoker.invoke("greet", "still")) == "hello still"


# ---- the answer to a finished run (pure) ----------------------------------------------


def _failed(kind: str, message: str) -> ConvergeTaskCalls:
    failure_kind = CallFailureKind(kind)
    return CallsFailed(
        task_id="t",
        failure_code=FailureCode.CALL_FAILED,
        failure_message=f"call #0 f(1) failed: {kind}: {message}",
        failed_call=CallFailure(
            index=0, kind=failure_kind, message=message, retryable=is_retryable(failure_kind)
        ),
    )


OK = CallsConverged(task_id="t", outputs=[RootOutput(0, b"42")])
OUTCOMES = [
    # (converged, (cpu_us, io_us) finished calls, wall_us, expected)
    (
        OK,
        [(300, 200)],
        2_000,
        InvokeSucceeded(call_id="c", result=b"42", queue_us=1_500, cpu_us=300, io_us=200),
    ),
    # Waiting for sub-calls is not the caller's CPU: queue never goes negative.
    (
        OK,
        [(900, 0), (900, 0)],
        1_000,
        InvokeSucceeded(call_id="c", result=b"42", queue_us=0, cpu_us=1_800),
    ),
    # The executor or the dispatcher wrote the budget message: it passes through.
    (
        _failed("BUDGET_EXCEEDED", "the call used 2 ms of CPU and IO, over its budget of 1 ms"),
        [],
        3_000,
        InvokeFailed(
            call_id="c",
            failure=Failure(
                CallFailureKind.BUDGET_EXCEEDED,
                "the call used 2 ms of CPU and IO, over its budget of 1 ms",
                False,
            ),
            queue_us=3_000,
        ),
    ),
    (
        _failed("EXECUTOR_LOST", "executor x0.1 lost: process exited with code -9"),
        [],
        10,
        InvokeFailed(
            call_id="c",
            failure=Failure(
                CallFailureKind.EXECUTOR_LOST,
                "executor x0.1 lost: process exited with code -9",
                True,
            ),
            queue_us=10,
        ),
    ),
    (
        CallsFailed(
            task_id="t",
            failure_code=FailureCode.OUTPUT_BYTES_EXCEEDED,
            failure_message="outputs over 10 bytes",
        ),
        [(5, 0)],
        10,
        InvokeFailed(
            call_id="c",
            failure=Failure(FailureCode.OUTPUT_BYTES_EXCEEDED, "outputs over 10 bytes", False),
            queue_us=5,
            cpu_us=5,
        ),
    ),
]


@pytest.mark.parametrize(("converged", "calls", "wall_us", "expected"), OUTCOMES)
def test_invoke_outcome(
    converged: ConvergeTaskCalls,
    calls: list[tuple[int, int]],
    wall_us: int,
    expected: InvokeOutcome,
) -> None:
    observer = InvokeObserver(debug=False)
    for call_id, (cpu_us, io_us) in enumerate(calls):
        observer.call_finished(call_id, cpu_us, io_us)
    outcome = invoke_outcome(
        call_id="c",
        converged=converged,
        observer=observer,
        wall_us=wall_us,
        epoch=0,
    )
    assert outcome == expected
