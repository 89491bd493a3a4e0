"""Sampled call spans with a real executor process: which calls carry a trace
context in the executor protocol, and the spans the Worker and the executor make
for them (the test's own tracer provider, never the global one)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support import wait_until

from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, CallsFailed, ConvergeTaskCalls, SendCalls
from blockx_executor import protocol as wire
from blockx_server.calls.call_spans import CallSpans
from blockx_server.calls.config import load_call_settings
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

FUNCTIONS = """
from blockx_executor import call

async def outer(x):
    return await call("double", x) + 1

def double(x):
    return x * 2

def boom(x):
    raise ValueError(f"bad input {x}")

def nap(ms):
    import time
    time.sleep(ms / 1000)
    return ms

def spin(x):
    while True:
        x += 1
"""


class Traced:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.processor = SimpleSpanProcessor(self.exporter)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("test")
        self.sent: list[wire.ExecuteCalls] = []
        self.call_spans: CallSpans | None = None

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@pytest.fixture
async def traced() -> AsyncIterator[tuple[CallEngine, Traced]]:
    seen = Traced()
    spans = seen.call_spans = CallSpans(2, tracer=seen.tracer, export=seen.processor.on_end)
    engine = CallEngine(
        CallEngineConfig(pool=ExecutorPoolConfig(count=1, heartbeat_interval_ms=50)),
        spans=spans,
    )
    await engine.start()
    send = engine.pool.send
    frames: wire.FrameDecoder[wire.ToExecutor] = wire.FrameDecoder(wire.ToExecutor)

    def recording(executor_id: str, frame: bytes) -> bool:
        seen.sent += [m for m in frames.feed(frame) if isinstance(m, wire.ExecuteCalls)]
        return send(executor_id, frame)

    engine.pool.send = recording  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(20):
            await engine.wait_ready()
        yield engine, seen
    finally:
        await engine.close()
        seen.provider.shutdown()


async def _run(
    engine: CallEngine,
    task_id: str,
    function: str,
    n: int,
    *args: Any,
    budget_ms: int | None = None,
) -> ConvergeTaskCalls:
    snapshot: CodeSnapshot = build_snapshot(1, {"fns": FUNCTIONS})
    io = TaskIoScope(IoRouter([MemoryBackend()]), task_id)
    calls = [list(args) if args else [i] for i in range(n)]
    async with asyncio.timeout(30):
        return await engine.run_calls(task_id, snapshot, io, function, calls, budget_ms=budget_ms)


async def test_untraced_runs_send_no_trace_context(traced: tuple[CallEngine, Traced]) -> None:
    engine, seen = traced
    assert isinstance(await _run(engine, "plain", "double", 5), CallsConverged)
    assert seen.sent
    assert all(batch.traces is None for batch in seen.sent)
    # A phase span that does not record (tracing off, or the trace not sampled).
    with trace.use_span(trace.INVALID_SPAN):
        assert isinstance(await _run(engine, "unsampled", "double", 5), CallsConverged)
    assert all(batch.traces is None for batch in seen.sent)
    assert seen.exporter.get_finished_spans() == ()


async def test_the_first_calls_of_a_traced_run_get_spans_in_both_processes(
    traced: tuple[CallEngine, Traced],
) -> None:
    engine, seen = traced
    with seen.tracer.start_as_current_span("CALLS") as phase:
        assert isinstance(await _run(engine, "traced", "double", 5), CallsConverged)
    contexts = [t for batch in seen.sent for t in batch.traces or [] if t is not None]
    assert len(contexts) == 2  # the first two dispatched, of five
    calls = seen.spans("call")
    runs = seen.spans("run")
    assert len(calls) == len(runs) == 2
    (executor_id,) = engine.pool.executor_ids()
    trace_id = phase.get_span_context().trace_id
    for call in calls:
        assert call.parent is not None
        assert call.parent.span_id == phase.get_span_context().span_id
        assert call.context is not None
        assert call.context.trace_id == trace_id
        assert call.attributes is not None
        assert call.attributes["blockx.task_id"] == "traced"
        assert call.attributes["blockx.function"] == "double"
        assert call.attributes["blockx.attempt"] == 1
        assert call.attributes["blockx.outcome"] == "ok"
        flags = call.context.trace_flags
        traceparent = f"00-{trace_id:032x}-{call.context.span_id:016x}-{flags:02x}"
        assert traceparent in contexts
    for run in runs:
        (call,) = [
            c for c in calls if c.context and run.parent and c.context.span_id == run.parent.span_id
        ]
        assert run.context is not None
        assert run.context.trace_id == trace_id
        assert run.resource.attributes["service.name"] == "blockx-executor"
        assert run.resource.attributes["process.pid"] == engine.pool.pid(executor_id)
        assert run.attributes is not None
        assert call.attributes is not None
        assert run.attributes["blockx.call_id"] == call.attributes["blockx.call_id"]
        assert run.start_time is not None
        assert call.start_time is not None
        assert call.start_time <= run.start_time


async def test_a_failed_call_span_names_its_failure_kind(
    traced: tuple[CallEngine, Traced],
) -> None:
    engine, seen = traced
    with seen.tracer.start_as_current_span("CALLS"):
        result = await _run(engine, "failing", "boom", 1)
    assert isinstance(result, CallsFailed)
    (call,) = seen.spans("call")
    (run,) = seen.spans("run")
    assert call.attributes is not None
    assert call.attributes["blockx.outcome"] == "USER_ERROR"
    assert call.attributes["blockx.failure_kind"] == "USER_ERROR"
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description is not None
    assert "bad input 0" in call.status.description
    assert run.attributes is not None
    assert run.attributes["blockx.outcome"] == "USER_ERROR"
    assert run.status.status_code is StatusCode.ERROR


async def test_each_attempt_of_a_traced_call_gets_its_own_span(
    traced: tuple[CallEngine, Traced],
) -> None:
    engine, seen = traced
    assert seen.call_spans is not None
    spans = seen.call_spans
    (executor_id,) = engine.pool.executor_ids()
    with seen.tracer.start_as_current_span("CALLS"):
        run = asyncio.create_task(_run(engine, "retried", "nap", 1, 300))
        await wait_until(lambda: bool(spans.live), "the call dispatched")
        pid = engine.pool.pid(executor_id)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the attempt is lost with its executor, then retried
        assert isinstance(await run, CallsConverged)
    first, second = sorted(seen.spans("call"), key=_attempt)
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes["blockx.call_id"] == second.attributes["blockx.call_id"]
    assert (first.attributes["blockx.attempt"], second.attributes["blockx.attempt"]) == (1, 2)
    assert first.attributes["blockx.outcome"] == "EXECUTOR_LOST"
    assert second.attributes["blockx.outcome"] == "ok"
    # Only the attempt that ran to its end has a run span, on the new executor.
    (run_span,) = seen.spans("run")
    assert run_span.parent is not None
    assert second.context is not None
    assert run_span.parent.span_id == second.context.span_id
    assert run_span.resource.attributes["process.pid"] != pid


def _attempt(span: ReadableSpan) -> int:
    attempt = (span.attributes or {}).get("blockx.attempt")
    assert isinstance(attempt, int)
    return attempt


def test_a_span_an_executor_sends_is_exported_only_for_the_context_it_was_given() -> None:
    """An executor runs user code, which may write forged span records."""
    seen = Traced()
    spans = CallSpans(2, tracer=seen.tracer, export=seen.processor.on_end)
    with seen.tracer.start_as_current_span("CALLS"):
        spans.open_run("t")
    command = SendCalls(
        executor_id="e1", task_id="t", code="", function="f", budget_ms=1, call_ids=[7], args=[[1]]
    )
    [given] = spans.traces(command) or [None]
    assert given is not None
    other = f"00-{'1' * 32}-{'2' * 16}-01"

    def record(call_id: int, parent: str, kind: str = "") -> wire.CallTraced:
        return wire.CallTraced(call_id, parent, 0xABC, 1, 2, kind)

    spans.executor_span("e2", None, record(7, given))  # another executor
    spans.executor_span("e1", None, record(7, other))  # another trace context
    spans.executor_span("e1", None, record(8, given))  # a call never traced
    assert seen.spans("run") == []
    spans.executor_span("e1", None, record(7, given, "USER_ERROR" + "x" * 1000))
    spans.executor_span("e1", None, record(7, given))  # sent again
    [run] = seen.spans("run")
    assert run.attributes is not None
    assert len(str(run.attributes["blockx.outcome"])) <= 40


def test_the_sampling_setting(tmp_path: Path) -> None:
    functions = {"FUNCTIONS_DIR": str(tmp_path)}
    assert load_call_settings(functions).engine.trace_calls_per_task == 10
    settings = load_call_settings({**functions, "BLOCKX_TRACE_CALLS_PER_TASK": "0"})
    assert settings.engine.trace_calls_per_task == 0


def test_a_bad_sampling_setting_stops_start_up_with_one_line(tmp_path: Path) -> None:
    binary = shutil.which("blockx-worker") or str(Path(sys.executable).parent / "blockx-worker")
    env = {
        **os.environ,
        "FUNCTIONS_DIR": str(tmp_path),
        "BLOCKX_TRACE_CALLS_PER_TASK": "some",
    }
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "blockx-worker: invalid configuration: BLOCKX_TRACE_CALLS_PER_TASK must be an "
        "integer (got 'some')"
    ]


async def test_a_call_killed_over_its_budget_says_so(traced: tuple[CallEngine, Traced]) -> None:
    """The watchdog kills the executor of a call that spins past its budget: that
    call's span fails BUDGET_EXCEEDED, as its attempt does."""
    engine, seen = traced
    with seen.tracer.start_as_current_span("CALLS"):
        result = await _run(engine, "spinning", "spin", 1, budget_ms=200)
    assert isinstance(result, CallsFailed)
    assert result.failed_call is not None
    assert result.failed_call.kind == "BUDGET_EXCEEDED"
    (call,) = seen.spans("call")
    assert call.attributes is not None
    assert call.attributes["blockx.outcome"] == "BUDGET_EXCEEDED"
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == "a call exceeded its budget"


async def test_a_sub_call_span_is_a_child_of_its_parent_calls(
    traced: tuple[CallEngine, Traced],
) -> None:
    engine, seen = traced
    with seen.tracer.start_as_current_span("CALLS") as phase:
        result = await _run(engine, "nested", "outer", 1)
    assert isinstance(result, CallsConverged)
    spans = {s.attributes["blockx.function"]: s for s in seen.spans("call") if s.attributes}
    outer, inner = spans["outer"], spans["double"]
    assert outer.parent is not None
    assert outer.parent.span_id == phase.get_span_context().span_id
    assert inner.parent is not None
    assert outer.context is not None
    assert inner.parent.span_id == outer.context.span_id
    assert [e.name for e in outer.events] == ["sub-call"]
