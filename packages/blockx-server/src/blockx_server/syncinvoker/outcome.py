"""One invoke's answer: what its calls cost, printed and read, and how it ended."""

from __future__ import annotations

from typing import Any, Final, TypeAlias, assert_never

import msgspec

from blockx_core.dispatch import CallsConverged, CallsFailed, CallUsage, ConvergeTaskCalls
from blockx_core.failures import Failure
from blockx_executor import protocol as wire
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome

# What a DebugInvoke returns at most, so a chatty function cannot build a reply
# larger than a gRPC message may be.
MAX_DEBUG_OUTPUT_CHARS: Final = 1024 * 1024
MAX_IO_TRACE_ENTRIES: Final = 10_000

_json = msgspec.json.Encoder()


class IoTraceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One IO request of an invoke: ``duration_us`` is the backend's time (0 when the
    read cache or a shared request answered), ``queue_us`` the time spent waiting."""

    backend: str
    op: str
    request: str
    duration_us: int
    success: bool
    error: str
    cached: bool = False
    shared: bool = False
    queue_us: int = 0


class InvokeObserver:
    """Collects one invoke's durations (every call of it), output and IO trace."""

    def __init__(self, debug: bool) -> None:
        self._debug = debug
        self.cpu_us = 0
        self.io_us = 0
        self.held_us = 0  # wall time the calls held an executor
        self._output: list[str] = []
        self._output_chars = 0
        self._dropped_chars = 0
        self.trace: list[IoTraceRecord] = []
        self.dropped_trace = 0

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None:
        # What the executor says of itself: kept only until the measured figures
        # (calls_measured) replace it.
        self.cpu_us += cpu_us
        self.io_us += io_us

    def calls_measured(self, usage: CallUsage) -> None:
        self.cpu_us = usage.cpu_ns // 1000
        self.io_us = usage.io_us
        self.held_us = usage.held_ms * 1000

    def call_output(self, call_id: int, text: str) -> None:
        if not self._debug or not text:
            return
        room = MAX_DEBUG_OUTPUT_CHARS - self._output_chars
        if len(text) > room:
            self._dropped_chars += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        self._output.append(text)
        self._output_chars += len(text)

    def io_traced(self, call_id: int, request: wire.IoRequested, outcome: IoOutcome) -> None:
        if not self._debug:
            return
        if len(self.trace) >= MAX_IO_TRACE_ENTRIES:
            self.dropped_trace += 1
            return
        # The positional arguments, or both kinds when the read has keyword arguments.
        arguments: Any = request.args
        if request.kwargs:
            arguments = {"args": request.args, "kwargs": request.kwargs}
        try:
            request_json = _json.encode(arguments).decode()
        except (TypeError, ValueError):
            request_json = repr(arguments)
        match outcome:
            case IoOk():
                success, error, cached = True, "", outcome.cached
            case IoFailed():
                success, error, cached = False, f"{outcome.kind}: {outcome.message}", False
            case _:
                assert_never(outcome)
        self.trace.append(
            IoTraceRecord(
                backend=request.backend,
                op=request.op,
                request=request_json,
                duration_us=outcome.io_us,
                success=success,
                error=error,
                cached=cached,
                shared=outcome.shared,
                queue_us=outcome.queue_us,
            )
        )

    def output(self) -> str:
        text = "".join(self._output)
        if self._dropped_chars:
            text += f"\n[... {self._dropped_chars} more characters of output dropped]\n"
        return text


class InvokeSucceeded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The call returned: ``result`` is its value as JSON."""

    call_id: str
    result: bytes
    queue_us: int = 0
    cpu_us: int = 0
    io_us: int = 0
    code_epoch: int = 0


class InvokeFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The call failed: ``failure`` is its own kind (a ``CallFailureKind``), or the
    run's ``FailureCode`` where no call is to blame (OUTPUT_BYTES_EXCEEDED)."""

    call_id: str
    failure: Failure
    queue_us: int = 0
    cpu_us: int = 0
    io_us: int = 0
    code_epoch: int = 0


InvokeOutcome: TypeAlias = InvokeSucceeded | InvokeFailed


def invoke_outcome(
    *,
    call_id: str,
    converged: ConvergeTaskCalls,
    observer: InvokeObserver,
    wall_us: int,
    epoch: int,
) -> InvokeOutcome:
    """The answer to one finished run (pure: every input is an argument)."""
    cpu_us, io_us, held_us = observer.cpu_us, observer.io_us, observer.held_us
    # Everything that was not holding an executor (running, sleeping) or IO:
    # queueing for an executor, transport.
    queue_us = max(0, wall_us - max(held_us, cpu_us) - io_us)
    match converged:
        case CallsConverged(outputs=outputs):
            return InvokeSucceeded(
                call_id=call_id,
                result=outputs[0].value_json,
                queue_us=queue_us,
                cpu_us=cpu_us,
                io_us=io_us,
                code_epoch=epoch,
            )
        case CallsFailed(failed_call=failed):
            # The call failed: answer with its own kind and message. A failure of the
            # run as a whole (e.g. OUTPUT_BYTES_EXCEEDED) keeps its code, and is not
            # transient.
            failure = (
                Failure(converged.failure_code, converged.failure_message, False)
                if failed is None
                else failed.failure
            )
            return InvokeFailed(
                call_id=call_id,
                failure=failure,
                queue_us=queue_us,
                cpu_us=cpu_us,
                io_us=io_us,
                code_epoch=epoch,
            )
        case _:
            assert_never(converged)
