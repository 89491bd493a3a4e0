"""The Calls phase with real executor processes over a real Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from blockx_core.calls import CallContext, RootCall, RootOutput
from blockx_core.code_view import CodeSnapshot, FunctionCodeView, build_snapshot
from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsConverged,
    CallsFailed,
    ConvergeTaskCalls,
    DispatchConfig,
)
from blockx_core.failures import CallFailureKind, FailureCode, IoErrorKind
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.calls.functions import CodeViewRefresher, DirectoryFunctionStore
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.errors import BackendError
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.io.settings import IoSettings
from blockx_server.runtime.clock import SYSTEM_CLOCK

FUNCTIONS = """
import hashlib
from blockx_executor import CallError, IoError, call, current_call, io

def double(x):
    return x * 2

def slow_square(x):
    # About 20 ms of CPU, so that a kill lands mid-call.
    d = b"x" * 1024
    for _ in range(600):
        d = hashlib.sha3_256(d).digest() * 32
    return x * x

def boom(x):
    raise ValueError(f"bad input {x}")

def fails_on(x, bad):
    if x == bad:
        raise RuntimeError(f"call {x} is the bad one")
    return x

def spin():
    while True:
        pass

def nap(ms):
    import time
    time.sleep(ms / 1000)
    return ms

def not_json():
    return object()

def big(n):
    return "x" * n

def env():
    import os
    return dict(os.environ)

def connect():
    import socket
    s = socket.socket()
    s.connect(("127.0.0.1", 9))

def write_file():
    open("blockx-written.txt", "w").write("no")

def run_process():
    import subprocess
    subprocess.run(["true"])

def segfault():
    import ctypes
    ctypes.string_at(0)

async def fetch(key):
    return await io.memory.get(key)

async def fetch_many(keys):
    return [await io.memory.get(k) for k in keys]

async def gated(x):
    await io.gate.wait(x)
    return x

async def writer():
    try:
        await io.memory.put("k", 1)
    except IoError:
        return "swallowed"
    return "wrote"

async def unhandled_io():
    return await io.memory.get()

async def missing_backend():
    try:
        await io.nowhere.get("k")
    except IoError as exc:
        return exc.kind

async def parent(x):
    child = await call("child", x)
    return {"parent": x, "child": child}

async def child(x):
    return await call("grandchild", x) + 1

def grandchild(x):
    return x * 10

async def calls_missing():
    try:
        await call("no_such_function", 1)
    except CallError as exc:
        return exc.kind

async def calls_failing():
    try:
        await call("boom", 7)
    except CallError as exc:
        return [exc.kind, "bad input 7" in exc.message]

async def whoami():
    return current_call().function

async def awaits_asyncio():
    import asyncio
    await asyncio.sleep(0)

def version():
    return "v1"

def scaled(x, *, scale=1, offset=0):
    return x * scale + offset

async def fetch_default(key):
    return await io.memory.get(key, default="none")

async def scaled_by_sub_call(x):
    return await call("scaled", x, scale=10, offset=1)

def where():
    info = current_call()
    return [info.block_number, info.block_hash]

async def where_in_sub_call():
    return await call("where")

async def unknown_backend_retryable():
    try:
        await io.nowhere.get("k")
    except IoError as exc:
        return [exc.kind, exc.retryable]

async def escapes_unknown_backend():
    return await io.nowhere.get("k")

async def escapes_flaky():
    return await io.flaky.get()

def half(x):
    return x // 2

async def half_by_sub_call(x):
    return await call("half", x)

async def read_with_default(x):
    return await io.memory.get("no-such-key", default=x)

async def sub_call_with_an_object():
    return await call("half", object())

def hold_gil(cpu_ms):
    # One regular-expression search holds the GIL (the executor's heartbeat thread
    # cannot run) for about cpu_ms of CPU: its cost grows with the square of the
    # text's length, measured first on shorter texts.
    import re
    import time
    pattern = re.compile(r"a*b")
    n = 1000
    while True:
        started = time.thread_time()
        pattern.search("a" * n)
        took = time.thread_time() - started
        if took > 0.01:
            break
        n *= 2
    pattern.search("a" * int(n * (cpu_ms / 1000 / took) ** 0.5))
    return cpu_ms
"""


class Gate:
    """io.gate.wait(x): blocks every read until ``open_at`` reads are waiting at once,
    which can only happen if calls interleave while suspended."""

    name = "gate"
    read_ops = frozenset({"wait"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.waiting = 0
        self.max_waiting = 0
        self.open_at = 1
        self.opened = asyncio.Event()

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)
        if self.waiting >= self.open_at:
            self.opened.set()
        await self.opened.wait()
        self.waiting -= 1
        return args[0]


def outputs(result: ConvergeTaskCalls) -> list[Any]:
    assert isinstance(result, CallsConverged), result
    return [json.loads(o.value_json) for o in result.outputs]


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def engine(gate: Gate) -> AsyncIterator[CallEngine]:
    config = CallEngineConfig(
        dispatch=DispatchConfig(
            call_deadline_ms=1500,
            # Far above the CPU budget: a spinning call meets its CPU budget first even
            # on a loaded machine.
            call_wall_limit_ms=60_000,
            executor_heartbeat_timeout_ms=2000,
            initial_window=8,
            task_max_inflight_calls=64,
            retry=CallRetryPolicy(max_attempts=3, backoff_ms=10, backoff_max_ms=50),
        ),
        pool=ExecutorPoolConfig(count=2, heartbeat_interval_ms=50),
    )
    eng = CallEngine(config)
    # The gate opens only once 8 reads wait at once: the backends' admission must
    # let 8 in from the start.
    _REGISTRIES[eng] = IoRouter(
        [MemoryBackend({"a": 1, "b": {"nested": [1, 2]}}), gate],
        settings=IoSettings(backend_min_concurrency=8),
    )
    await eng.start()
    async with asyncio.timeout(20):
        await eng.wait_ready()
    yield eng
    await eng.close()


@contextlib.asynccontextmanager
async def one_executor(dispatch: DispatchConfig) -> AsyncIterator[CallEngine]:
    """A started engine with one executor and an empty memory backend."""
    eng = CallEngine(
        CallEngineConfig(
            dispatch=dispatch, pool=ExecutorPoolConfig(count=1, heartbeat_interval_ms=50)
        )
    )
    _REGISTRIES[eng] = IoRouter([MemoryBackend()])
    await eng.start()
    try:
        async with asyncio.timeout(20):
            await eng.wait_ready()
        yield eng
    finally:
        await eng.close()


@pytest.fixture
def snapshot() -> CodeSnapshot:
    return build_snapshot(1, {"fns": FUNCTIONS})


# Each engine's IO backends; every run opens a read-only scope on them, as a task does.
_REGISTRIES: dict[CallEngine, IoRouter] = {}


def scope(engine: CallEngine, task_id: str) -> TaskIoScope:
    return TaskIoScope(_REGISTRIES[engine], task_id)


async def run(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, calls: list[list[Any]]
) -> ConvergeTaskCalls:
    task_id = f"task-{function}-{len(calls)}"
    async with asyncio.timeout(30):
        return await engine.run_calls(task_id, snapshot, scope(engine, task_id), function, calls)


def failure(result: ConvergeTaskCalls) -> str:
    assert isinstance(result, CallsFailed)
    assert result.failure_code is FailureCode.CALL_FAILED
    return result.failure_message


async def test_round_trip_in_root_order(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    result = await run(engine, snapshot, "double", [[i] for i in range(3000)])
    assert outputs(result) == [2 * i for i in range(3000)]
    assert engine.core.live_calls() == 0


async def test_empty_call_list_converges_at_once(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    result = await run(engine, snapshot, "double", [])
    assert isinstance(result, CallsConverged)
    assert result.outputs == []


async def test_io_reads_from_the_memory_backend(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    result = await run(engine, snapshot, "fetch_many", [[["a", "b", "missing"]]])
    assert outputs(result) == [[1, {"nested": [1, 2]}, None]]


async def test_calls_interleave_while_suspended_on_io(
    engine: CallEngine, snapshot: CodeSnapshot, gate: Gate
) -> None:
    # The first window is 8 calls on 2 executors: the gate opens only when all 8
    # reads wait at once, which needs several suspended calls on each executor.
    gate.open_at = 8
    result = await run(engine, snapshot, "gated", [[i] for i in range(40)])
    assert outputs(result) == list(range(40))
    assert gate.max_waiting >= 8


async def test_nested_sub_calls(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    result = await run(engine, snapshot, "parent", [[1], [2]])
    assert outputs(result) == [{"parent": 1, "child": 11}, {"parent": 2, "child": 21}]


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        ("calls_missing", "FUNCTION_NOT_FOUND"),
        ("calls_failing", ["USER_ERROR", True]),
        ("missing_backend", "UNKNOWN_BACKEND"),
        ("whoami", "whoami"),
    ],
)
async def test_errors_a_function_can_handle(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, expected: Any
) -> None:
    assert outputs(await run(engine, snapshot, function, [[]])) == [expected]


async def test_user_exception_traceback_reaches_the_failure_message(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    message = failure(await run(engine, snapshot, "boom", [[42]]))
    assert "call #0 boom(42) failed: USER_ERROR" in message
    assert "ValueError: bad input 42" in message
    assert 'File "fns.py", line' in message
    assert 'raise ValueError(f"bad input {x}")' in message


async def test_fast_fail_cancels_the_rest(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    message = failure(await run(engine, snapshot, "fails_on", [[i, 37] for i in range(200)]))
    assert "call #37" in message
    assert "call 37 is the bad one" in message
    assert engine.core.live_calls() == 0


async def test_syntax_error_is_a_compile_error(engine: CallEngine) -> None:
    broken = build_snapshot(1, {"broken": "def f(:\n    pass\n", "ok": "def g():\n    return 1\n"})
    # The module does not parse, so f is not in the snapshot at all.
    message = failure(await run(engine, broken, "f", [[]]))
    assert "FUNCTION_NOT_FOUND" in message
    assert "broken" in message
    assert outputs(await run(engine, broken, "g", [[]])) == [1]


async def test_module_that_raises_while_loading(engine: CallEngine) -> None:
    snap = build_snapshot(
        1, {"bad": "raise ImportError('no such thing')\ndef f():\n    return 1\n"}
    )
    message = failure(await run(engine, snap, "f", [[]]))
    assert "COMPILE_ERROR" in message
    assert "ImportError: no such thing" in message


async def test_an_unhandled_io_error_fails_the_call_as_io_error(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    message = failure(await run(engine, snapshot, "unhandled_io", [[]]))
    assert "IO_ERROR" in message
    assert "BAD_REQUEST" in message


async def test_missing_function(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    message = failure(await run(engine, snapshot, "doubel", [[1]]))
    assert "FUNCTION_NOT_FOUND" in message
    assert "double" in message  # the close match


async def test_return_value_that_is_not_json(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    message = failure(await run(engine, snapshot, "not_json", [[]]))
    assert "BAD_RESULT" in message
    assert "JSON" in message


async def test_awaiting_asyncio_is_refused(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    message = failure(await run(engine, snapshot, "awaits_asyncio", [[]]))
    assert "only io.<backend>.<op>(...) and call(...)" in message


async def test_a_write_fails_the_call_even_when_caught(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    message = failure(await run(engine, snapshot, "writer", [[]]))
    assert "WRITE_FORBIDDEN" in message
    assert "io.memory.put is a write" in message


@pytest.mark.parametrize(
    ("function", "words"),
    [
        ("connect", "open network connections"),
        ("write_file", "write files"),
        ("run_process", "start or signal processes"),
    ],
)
async def test_sandbox(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, words: str
) -> None:
    message = failure(await run(engine, snapshot, function, [[]]))
    assert "PermissionError" in message
    assert words in message


async def test_environment_is_scrubbed(
    engine: CallEngine, snapshot: CodeSnapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    [environ] = outputs(await run(engine, snapshot, "env", [[]]))
    assert set(environ) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "HOME",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
    }
    assert "AWS_SECRET_ACCESS_KEY" not in environ
    assert os.environ.get("HOME") != environ.get("HOME")


async def test_output_cap(gate: Gate, snapshot: CodeSnapshot) -> None:
    async with one_executor(DispatchConfig(max_collected_output_bytes=10_000)) as eng:
        ok = await run(eng, snapshot, "big", [[1000]] * 9)
        assert isinstance(ok, CallsConverged)
        capped = await run(eng, snapshot, "big", [[1000]] * 11)
        assert isinstance(capped, CallsFailed)
        assert capped.failure_code is FailureCode.OUTPUT_BYTES_EXCEEDED
        assert "MAX_COLLECTED_OUTPUT_BYTES" in capped.failure_message


async def test_infinite_loop_is_killed_and_the_worker_keeps_serving(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    before = set(engine.pool.executor_ids())
    message = failure(await run(engine, snapshot, "spin", [[]]))
    assert "BUDGET_EXCEEDED" in message
    assert "its executor was killed" in message
    await wait_until(
        lambda: len(engine.pool.executor_ids()) == 2 and set(engine.pool.executor_ids()) != before,
        "the killed executor replaced",
    )
    assert outputs(await run(engine, snapshot, "double", [[5]])) == [10]


async def test_kill_9_mid_call_loses_nothing_and_reports_nothing_twice(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    calls = [[i] for i in range(120)]
    task = asyncio.create_task(run(engine, snapshot, "slow_square", calls))
    await wait_until(lambda: engine.core.live_calls() > 0, "calls in flight")
    victim = engine.pool.executor_ids()[0]
    pid = engine.pool.pid(victim)
    assert pid is not None
    await asyncio.sleep(0.1)  # let it get into the batch
    os.kill(pid, signal.SIGKILL)
    result = await task
    assert outputs(result) == [i * i for i in range(120)]
    await wait_until(lambda: victim not in engine.pool.executor_ids(), "the victim replaced")


async def test_a_call_that_kills_its_executor_is_retried_then_fails(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    message = failure(await run(engine, snapshot, "segfault", [[]]))
    assert "after 3 attempts" in message
    assert "EXECUTOR_LOST" in message
    await wait_until(lambda: len(engine.pool.executor_ids()) == 2, "respawned executors")
    assert outputs(await run(engine, snapshot, "double", [[1]])) == [2]


async def test_cancel_drops_the_calls(
    engine: CallEngine, snapshot: CodeSnapshot, gate: Gate
) -> None:
    gate.open_at = 10_000  # never opens
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await engine.run_calls(
                "cancelled", snapshot, scope(engine, "cancelled"), "gated", [[i] for i in range(20)]
            )
    assert engine.core.live_calls() == 0
    assert not engine.core.has_task("cancelled")
    assert outputs(await run(engine, snapshot, "double", [[3]])) == [6]


async def test_a_task_keeps_its_epoch_while_newer_code_runs(
    engine: CallEngine, gate: Gate, tmp_path: Path
) -> None:
    """FUNCTIONS_DIR edited while a task runs: the running task finishes on the epoch
    it pinned (its sub-call too); a task started after the edit runs the new code."""
    source = FUNCTIONS.replace(
        "async def gated(x):\n    await io.gate.wait(x)\n    return x",
        'async def gated(x):\n    await io.gate.wait(x)\n    return await call("version")',
    )
    (tmp_path / "fns.py").write_text(source)
    view = FunctionCodeView(retention_ms=60_000)
    refresher = CodeViewRefresher(DirectoryFunctionStore(tmp_path), view, SYSTEM_CLOCK, 1000)
    first = await refresher.refresh_once()
    assert first is not None
    gate.open_at = 10_000
    old = view.pin("old", SYSTEM_CLOCK.now_ms())
    old_task = asyncio.create_task(
        engine.run_calls("old", old, scope(engine, "old"), "gated", [[1]])
    )
    await wait_until(lambda: gate.waiting == 1, "the old task suspended")

    (tmp_path / "fns.py").write_text(source.replace('return "v1"', 'return "v2"'))
    second = await refresher.refresh_once()
    assert second is not None
    assert second.epoch == first.epoch + 1
    new = view.pin("new", SYSTEM_CLOCK.now_ms())
    assert outputs(await run(engine, new, "version", [[]])) == ["v2"]

    gate.opened.set()
    async with asyncio.timeout(20):
        assert outputs(await old_task) == ["v1"]
    view.unpin("old", SYSTEM_CLOCK.now_ms())
    assert view.pinned("old") is None


async def test_executor_heartbeats_make_the_pool_ready(engine: CallEngine) -> None:
    ids = engine.pool.executor_ids()
    assert len(ids) == 2
    assert sorted(engine.core.executor_ids()) == sorted(ids)


# ---- keyword arguments, call context, root calls that stream in ----------------------


async def test_root_calls_and_sub_calls_carry_keyword_arguments(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    calls = [RootCall([2], {"scale": 3}), RootCall([2]), RootCall([1], {"offset": 5})]
    result = await engine.run_calls("kw", snapshot, scope(engine, "kw"), "scaled", calls)
    assert outputs(result) == [6, 2, 6]
    assert outputs(await run(engine, snapshot, "scaled_by_sub_call", [[4]])) == [41]


async def test_io_requests_carry_keyword_arguments(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    assert outputs(await run(engine, snapshot, "fetch_default", [["a"], ["zz"]])) == [1, "none"]


async def test_the_call_context_reaches_current_call_and_sub_calls_and_tags_the_output(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    block = CallContext(block_number=17, block_hash="0xab")
    calls = [RootCall([], context=block), RootCall([])]
    for function in ("where", "where_in_sub_call"):
        task_id = f"ctx-{function}"
        result = await engine.run_calls(task_id, snapshot, scope(engine, task_id), function, calls)
        assert isinstance(result, CallsConverged)
        assert result.outputs == [
            RootOutput(0, b'[17,"0xab"]', block),
            RootOutput(1, b"[null,null]"),
        ]


async def test_root_calls_fed_in_chunks_converge_once_the_source_is_done(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    run = engine.open_calls("stream", snapshot, scope(engine, "stream"), "double")
    run.add([[1], [2]])
    run.add([])
    # Nothing converges while the source may still give calls, even when all ran.
    await wait_until(lambda: engine.core.live_calls() == 0, "the first chunk done")
    result_task = asyncio.ensure_future(run.result())
    await asyncio.sleep(0)
    assert not result_task.done()
    run.add([RootCall([3])])
    run.done()
    async with asyncio.timeout(30):
        assert outputs(await result_task) == [2, 4, 6]
    assert not engine.core.has_task("stream")


async def test_a_run_of_a_missing_function_fails_at_its_first_root_call(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    empty = engine.open_calls("none-yet", snapshot, scope(engine, "none-yet"), "doubel")
    empty.done()
    assert isinstance(await empty.result(), CallsConverged)
    run = engine.open_calls("missing", snapshot, scope(engine, "missing"), "doubel")
    run.add([[1]])
    run.done()
    result = await run.result()
    assert isinstance(result, CallsFailed)
    assert result.failed_call is not None
    assert result.failed_call.kind is CallFailureKind.FUNCTION_NOT_FOUND


async def test_a_failed_root_call_is_a_field_of_the_convergence(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    result = await run(engine, snapshot, "boom", [[42]])
    assert isinstance(result, CallsFailed)
    failed = result.failed_call
    assert failed is not None
    assert (failed.index, failed.kind, failed.retryable) == (0, CallFailureKind.USER_ERROR, False)
    assert failed.message.startswith("ValueError: bad input 42")
    assert result.failure_message.endswith(failed.message)


class Flaky:
    """io.flaky.get(): UNAVAILABLE for the first ``failures`` requests, then 'ok'."""

    name = "flaky"
    read_ops = frozenset({"get"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.requests = 0

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.requests += 1
        if self.requests <= self.failures:
            raise BackendError(IoErrorKind.UNAVAILABLE, "try again")
        return "ok"


async def test_an_io_error_that_cannot_succeed_on_retry_is_not_retried(
    snapshot: CodeSnapshot,
) -> None:
    config = CallEngineConfig(
        dispatch=DispatchConfig(
            retry=CallRetryPolicy(
                max_attempts=3,
                backoff_ms=1,
                backoff_max_ms=5,
                retry_on=frozenset({CallFailureKind.IO_ERROR}),
            )
        ),
        pool=ExecutorPoolConfig(count=1, heartbeat_interval_ms=50),
    )
    eng = CallEngine(config)
    flaky = Flaky(failures=1)
    registry = IoRouter([MemoryBackend({}), flaky])
    await eng.start()
    try:
        async with asyncio.timeout(30):
            await eng.wait_ready()

            async def go(function: str) -> ConvergeTaskCalls:
                io = TaskIoScope(registry, function)
                return await eng.run_calls(function, snapshot, io, function, [[]])

            assert outputs(await go("unknown_backend_retryable")) == [["UNKNOWN_BACKEND", False]]
            permanent = await go("escapes_unknown_backend")
            assert isinstance(permanent, CallsFailed)
            assert permanent.failed_call is not None
            assert permanent.failed_call.kind is CallFailureKind.IO_ERROR
            assert (permanent.failed_call.attempts, permanent.failed_call.retryable) == (1, False)
            # UNAVAILABLE may pass: the second attempt reads "ok".
            assert outputs(await go("escapes_flaky")) == ["ok"]
            assert flaky.requests == 2
    finally:
        await eng.close()


async def test_a_sleeping_call_is_stopped_at_the_wall_limit(snapshot: CodeSnapshot) -> None:
    async with one_executor(
        DispatchConfig(call_wall_limit_ms=300, executor_heartbeat_timeout_ms=60_000)
    ) as eng:
        [before] = eng.pool.executor_ids()
        message = failure(await run(eng, snapshot, "nap", [[40_000]]))
        assert "BUDGET_EXCEEDED" in message
        assert "wall time" in message
        assert "CALL_WALL_LIMIT_MS (300 ms)" in message
        # It did not stop when cancelled: its executor was killed and replaced.
        await wait_until(
            lambda: eng.pool.executor_ids() not in ([], [before]), "the executor replaced"
        )
        assert outputs(await run(eng, snapshot, "double", [[5]])) == [10]


async def test_executors_are_recycled_after_max_calls_and_no_call_fails(
    snapshot: CodeSnapshot,
) -> None:
    async with one_executor(DispatchConfig(executor_max_calls=3)) as eng:
        [first] = eng.pool.executor_ids()
        assert outputs(await run(eng, snapshot, "double", [[i] for i in range(10)])) == [
            2 * i for i in range(10)
        ]
        assert first not in eng.pool.executor_ids()


# ---- what travels to and from executors ------------------------------------------------

BIG = 2**200


async def test_integers_beyond_64_bits_travel_to_and_from_executors(
    snapshot: CodeSnapshot,
) -> None:
    """The first call after a code change carries 2**200: its module's LoadCode and the
    call reach the executor, and every later call of that module succeeds there."""
    async with one_executor(DispatchConfig()) as eng:
        assert outputs(await run(eng, snapshot, "double", [[1]])) == [2]
        changed = build_snapshot(2, {"fns": FUNCTIONS + "\n# changed\n"})
        assert outputs(await run(eng, changed, "double", [[BIG]])) == [2 * BIG]
        assert outputs(await run(eng, changed, "half", [[8], [-BIG], [2**64]])) == [
            4,
            -BIG // 2,
            2**63,
        ]
        # From the executor: a sub-call's arguments and an IO request's.
        assert outputs(await run(eng, changed, "half_by_sub_call", [[BIG]])) == [BIG // 2]
        assert outputs(await run(eng, changed, "read_with_default", [[-BIG]])) == [-BIG]


async def test_arguments_that_cannot_reach_an_executor_fail_only_their_own_call(
    snapshot: CodeSnapshot,
) -> None:
    async with one_executor(DispatchConfig()) as eng:
        [pid] = [eng.pool.pid(e) for e in eng.pool.executor_ids()]

        async def go(task_id: str, function: str, calls: list[Any]) -> ConvergeTaskCalls:
            return await eng.run_calls(task_id, snapshot, scope(eng, task_id), function, calls)

        # All three go out in one flush, with the module's LoadCode.
        async with asyncio.timeout(30):
            unsendable, lone_surrogate, fine = await asyncio.gather(
                go("object", "double", [RootCall([object()])]),
                go("surrogate", "double", [RootCall(["\udc80"])]),
                go("fine", "double", [[1], [2]]),
            )
        assert outputs(fine) == [2, 4]
        for failed in (unsendable, lone_surrogate):
            assert isinstance(failed, CallsFailed)
            call = failed.failed_call
            assert call is not None
            assert call.kind is CallFailureKind.BAD_ARGUMENTS
            assert (call.attempts, call.retryable) == (1, False)
            assert "cannot be sent to an executor" in call.message
        # From the executor: a sub-call of an object fails that call alone.
        sub = await run(eng, snapshot, "sub_call_with_an_object", [[]])
        assert isinstance(sub, CallsFailed)
        assert sub.failed_call is not None
        assert sub.failed_call.kind is CallFailureKind.BAD_ARGUMENTS
        assert "call('half', <object object at" in sub.failed_call.message
        assert outputs(await run(eng, snapshot, "half", [[4]])) == [2]
        assert [eng.pool.pid(e) for e in eng.pool.executor_ids()] == [pid]


# ---- budgets are judged by the CPU the kernel reports ----------------------------------


async def test_a_call_holding_the_gil_is_judged_by_its_cpu_not_by_missed_heartbeats(
    snapshot: CodeSnapshot,
) -> None:
    """hold_gil starves the executor's heartbeat thread for its whole run. Within its
    budget it is not killed; over it, it fails BUDGET_EXCEEDED once; a neighbour on the
    same executor is never charged (one attempt only: a charged one would fail)."""
    dispatch = DispatchConfig(
        call_deadline_ms=30_000,
        call_wall_limit_ms=120_000,
        executor_heartbeat_timeout_ms=500,
        retry=CallRetryPolicy(max_attempts=1),
    )
    async with one_executor(dispatch) as eng:
        [before] = eng.pool.executor_ids()

        async def go(
            task_id: str, function: str, arg: int, budget_ms: int | None = None
        ) -> ConvergeTaskCalls:
            io = scope(eng, task_id)
            return await eng.run_calls(
                task_id, snapshot, io, function, [[arg]], budget_ms=budget_ms
            )

        async with asyncio.timeout(60):
            within, neighbour = await asyncio.gather(
                go("within", "hold_gil", 1_500), go("neighbour", "double", 1)
            )
        assert outputs(within) == [1_500]
        assert outputs(neighbour) == [2]
        assert eng.pool.executor_ids() == [before]

        async with asyncio.timeout(60):
            over, neighbour = await asyncio.gather(
                go("over", "hold_gil", 600_000, budget_ms=1_000), go("neighbour-2", "double", 2)
            )
        assert isinstance(over, CallsFailed)
        failed = over.failed_call
        assert failed is not None
        assert (failed.kind, failed.attempts) == (CallFailureKind.BUDGET_EXCEEDED, 1)
        assert "budget of 1000 ms" in failed.message
        assert outputs(neighbour) == [4]
