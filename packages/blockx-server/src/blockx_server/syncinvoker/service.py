"""syncinvoker.v1.SyncInvokerService over grpclib: one function call, answered on the spot.

``Invoke`` runs exactly one call through the Sync Invoker's own CallEngine as a
one-call task with a fresh internal task id, pinned to the current code epoch.
A function that fails is a normal answer (``success=false`` with the call's
failure kind); gRPC errors are only for a bad request (INVALID_ARGUMENT), a
server that is not ready or is stopping (UNAVAILABLE) and overload
(RESOURCE_EXHAUSTED). ``DebugInvoke`` adds what the function printed or logged
and a trace of its IO requests. ``Precheck`` answers from the code alone
(``blockx_core.signature.precheck``); it never runs user code.

Durations come from the engine's CallObserver: ``cpu_us`` and ``io_us`` summed over
the invoke's calls (its sub-calls included), and ``queue_us`` is everything else
in the invoke's wall time (waiting for an executor, transport to it, loading the
module on an executor's first use of it).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from grpclib.exceptions import GRPCError
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from blockx_core.code_view import FunctionCodeView, NoSnapshotError
from blockx_core.dispatch import CallFailureKind, ConvergeTaskCalls
from blockx_core.errors import ErrorCode
from blockx_core.signature import precheck
from blockx_executor import protocol as wire
from blockx_proto import syncinvoker_v1 as pb
from blockx_server.calls.engine import CallEngine
from blockx_server.io.errors import IoOutcome
from blockx_server.io.registry import IoRegistry
from blockx_server.io.scope import TaskIoScope
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.status import SYNC_INVOKER_STATUS

# Whether invoking again may help, per failure kind of the call.
RETRYABLE: Final[Mapping[CallFailureKind, bool]] = {
    CallFailureKind.USER_ERROR: False,
    CallFailureKind.COMPILE_ERROR: False,
    CallFailureKind.FUNCTION_NOT_FOUND: False,
    CallFailureKind.BAD_RESULT: False,
    CallFailureKind.BUDGET_EXCEEDED: False,
    CallFailureKind.WRITE_FORBIDDEN: False,
    # The executor process died (memory limit, a kill): a new invoke gets a fresh one.
    CallFailureKind.EXECUTOR_LOST: True,
    # A read the function did not handle failed; backends fail transiently.
    CallFailureKind.IO_ERROR: True,
}

# What a DebugInvoke returns at most, so a chatty function cannot build a reply
# larger than a gRPC message may be.
MAX_DEBUG_OUTPUT_CHARS: Final = 1024 * 1024
MAX_IO_TRACE_ENTRIES: Final = 10_000
MAX_CALL_ID_CHARS: Final = 128
# The dispatcher's _short_args limit, to rebuild the exact failure prefix.
_ARGS_TEXT_LIMIT: Final = 120

_json = msgspec.json.Encoder()


def _refuse(code: ErrorCode, message: str) -> GRPCError:
    return GRPCError(SYNC_INVOKER_STATUS[code], message)


# ---- the engine -----------------------------------------------------------------------


# ---- one invoke -----------------------------------------------------------------------


class IoTraceRecord(msgspec.Struct, frozen=True, kw_only=True):
    backend: str
    op: str
    request: str
    duration_us: int
    success: bool
    error: str


class InvokeObserver:
    """Collects one invoke's durations (every call of it), output and IO trace."""

    def __init__(self, budget_us: int, debug: bool) -> None:
        self._budget_us = budget_us
        self._debug = debug
        self.cpu_us = 0
        self.io_us = 0
        self._output: list[str] = []
        self._output_chars = 0
        self._dropped_chars = 0
        self.trace: list[IoTraceRecord] = []
        self.dropped_trace = 0

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None:
        self.cpu_us += cpu_us
        self.io_us += io_us

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
        try:
            request_json = _json.encode(request.args).decode()
        except (TypeError, ValueError):
            request_json = repr(request.args)
        self.trace.append(
            IoTraceRecord(
                backend=request.backend,
                op=request.op,
                request=request_json,
                duration_us=outcome.io_us,
                success=outcome.ok,
                error="" if outcome.ok else f"{outcome.error_kind}: {outcome.error}",
            )
        )

    def output(self) -> str:
        text = "".join(self._output)
        if self._dropped_chars:
            text += f"\n[... {self._dropped_chars} more characters of output dropped]\n"
        return text


def args_text(args: list[Any]) -> str:
    """The arguments as the dispatcher prints them in a failure message."""
    text = ", ".join(repr(a) for a in args)
    return text if len(text) <= _ARGS_TEXT_LIMIT else text[: _ARGS_TEXT_LIMIT - 3] + "..."


_KINDS = "|".join(kind.value for kind in CallFailureKind)
_AFTER_PREFIX = re.compile(rf" failed(?: after \d+ attempts)?: ({_KINDS}): ")
_ANYWHERE = re.compile(rf"\) failed(?: after \d+ attempts)?: ({_KINDS}): ")


def split_call_failure(message: str, function: str, args: list[Any]) -> tuple[str, str] | None:
    """(failure kind, the call's own message) from the dispatcher's CALL_FAILED text
    ``call #0 fn(args) failed[ after N attempts]: KIND: message``, or None.

    The prefix is rebuilt from the same function and arguments, so arguments that
    contain text like ``) failed: USER_ERROR:`` cannot confuse the split; should the
    format drift, the first such marker with a known kind is taken instead.
    """
    prefix = f"call #0 {function}({args_text(args)})"
    if message.startswith(prefix):
        match = _AFTER_PREFIX.match(message, len(prefix))
        if match is not None:
            return match.group(1), message[match.end() :]
    match = _ANYWHERE.search(message)
    if match is not None:
        return match.group(1), message[match.end() :]
    return None


class InvokeOutcome(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    success: bool
    result: bytes = b""
    failure_code: str = ""
    failure_message: str = ""
    retryable: bool = False
    queue_us: int = 0
    cpu_us: int = 0
    io_us: int = 0
    code_epoch: int = 0


def invoke_outcome(
    *,
    call_id: str,
    converged: ConvergeTaskCalls,
    observer: InvokeObserver,
    function: str,
    args: list[Any],
    budget_ms: int,
    wall_us: int,
    epoch: int,
) -> InvokeOutcome:
    """The answer to one finished run (pure: every input is an argument)."""
    cpu_us, io_us = observer.cpu_us, observer.io_us
    success, result, code, message = converged.success, b"", "", ""
    if success:
        result = converged.outputs[0]
    else:
        split = split_call_failure(converged.failure_message, function, args)
        if split is None:
            # A failure of the run as a whole (e.g. OUTPUT_BYTES_EXCEEDED) keeps its code.
            code = converged.failure_code.value if converged.failure_code else "CALL_FAILED"
            message = converged.failure_message
        else:
            code, message = split
    return InvokeOutcome(
        call_id=call_id,
        success=success,
        result=result,
        failure_code=code,
        failure_message=message,
        retryable=_retryable(code),
        # Everything that was not CPU or IO: queueing for an executor, transport.
        queue_us=max(0, wall_us - cpu_us - io_us),
        cpu_us=cpu_us,
        io_us=io_us,
        code_epoch=epoch,
    )


def _retryable(code: str) -> bool:
    try:
        return RETRYABLE[CallFailureKind(code)]
    except ValueError:
        return False  # a run-level code (e.g. OUTPUT_BYTES_EXCEEDED) is not transient


# ---- metrics --------------------------------------------------------------------------


class _StateCollector(Collector):
    def __init__(self, service: SyncInvokerService) -> None:
        self._service = service

    def collect(self) -> list[GaugeMetricFamily]:
        service = self._service
        return [
            GaugeMetricFamily(
                "blockx_syncinvoker_invokes_in_flight",
                "Invoke and DebugInvoke requests running now.",
                value=service.in_flight,
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_executors_up",
                "Python Executor processes connected to this Sync Invoker.",
                value=len(service.engine.pool.executor_ids()),
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_code_epoch",
                "The current Function Code View epoch (0 before code is loaded).",
                value=service.code_epoch,
            ),
            GaugeMetricFamily(
                "blockx_syncinvoker_ready", "1 when invokes are accepted.", value=int(service.ready)
            ),
        ]


class SyncInvokerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._requests = Counter(
            "blockx_syncinvoker_requests",
            "Requests by RPC and outcome: ok, a failure code, or the gRPC status of a refusal.",
            ["rpc", "outcome"],
            registry=registry,
        )
        self._latency = Histogram(
            "blockx_syncinvoker_invoke_duration_seconds",
            "Wall time of accepted Invoke / DebugInvoke requests, by RPC and success.",
            ["rpc", "success"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
        )

    def watch(self, service: SyncInvokerService) -> None:
        self.registry.register(_StateCollector(service))

    def outcome(self, rpc: str, outcome: str) -> None:
        self._requests.labels(rpc, outcome).inc()

    def invoked(self, rpc: str, outcome: InvokeOutcome, seconds: float) -> None:
        self.outcome(rpc, "ok" if outcome.success else outcome.failure_code)
        self._latency.labels(rpc, "true" if outcome.success else "false").observe(seconds)


# ---- the service ----------------------------------------------------------------------


class _Request(msgspec.Struct, frozen=True, kw_only=True):
    function: str
    args: list[Any]
    budget_ms: int
    call_id: str


_JSON_TYPES: Final[Mapping[type, str]] = {
    dict: "object",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def decode_args(text: str) -> list[Any] | str:
    """The positional arguments of a JSON array text, or why they are refused."""
    try:
        args = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        return f'args must be JSON array text, e.g. ["ct2", 1]: {exc}'
    if not isinstance(args, list):
        return (
            f'args must be a JSON array of the positional arguments, e.g. ["ct2", 1] '
            f"(got a JSON {_JSON_TYPES.get(type(args), type(args).__name__)})"
        )
    try:
        # Arguments travel to the executor as msgpack, which has no room for huge ints.
        msgspec.msgpack.encode(args)
    except (OverflowError, TypeError, ValueError) as exc:
        return f"args cannot be passed to a function: {exc}"
    return args


class SyncInvokerService(pb.SyncInvokerServiceBase):
    def __init__(
        self,
        engine: CallEngine,
        view: FunctionCodeView,
        io: IoRegistry,
        *,
        default_timeout_ms: int,
        max_timeout_ms: int,
        max_concurrent: int,
        metrics: SyncInvokerMetrics,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.engine = engine
        self._view = view
        self._io = io
        self._default_timeout_ms = default_timeout_ms
        # The engine's own budget is the ceiling: a cancelled call past it is killed.
        self._max_timeout_ms = min(max_timeout_ms, engine.core.config.call_deadline_ms)
        self._max_concurrent = max_concurrent
        self._metrics = metrics
        self._clock = clock
        self._ready = False
        self._stopping = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        metrics.watch(self)

    @property
    def ready(self) -> bool:
        return self._ready and not self._stopping

    @property
    def code_epoch(self) -> int:
        current = self._view.current
        return 0 if current is None else current.epoch

    def set_ready(self) -> None:
        """Executors heartbeat and code is loaded: accept invokes."""
        self._ready = True

    def stop_accepting(self) -> None:
        """Shutting down: new requests answer UNAVAILABLE, running invokes finish."""
        self._stopping = True

    async def wait_idle(self) -> None:
        await self._idle.wait()

    # ---- RPCs ---------------------------------------------------------------------------

    async def invoke(self, message: pb.InvokeRequest) -> pb.InvokeResponse:
        outcome, _ = await self._invoke(
            "Invoke", message.function, message.args, message.timeout_ms, message.call_id, False
        )
        return _response(outcome)

    async def debug_invoke(self, message: pb.DebugInvokeRequest) -> pb.DebugInvokeResponse:
        outcome, observer = await self._invoke(
            "DebugInvoke",
            message.function,
            message.args,
            message.timeout_ms,
            message.call_id,
            True,
        )
        trace = observer.trace if observer is not None else []
        if observer is not None and observer.dropped_trace:
            trace = [
                *trace,
                IoTraceRecord(
                    backend="",
                    op="",
                    request="",
                    duration_us=0,
                    success=False,
                    error=f"{observer.dropped_trace} more IO requests not traced",
                ),
            ]
        return pb.DebugInvokeResponse(
            response=_response(outcome),
            output=observer.output() if observer is not None else "",
            io_trace=[
                pb.IoTraceEntry(
                    backend=r.backend,
                    op=r.op,
                    request=r.request,
                    duration_us=r.duration_us,
                    success=r.success,
                    error=r.error,
                )
                for r in trace
            ],
        )

    async def precheck(self, message: pb.PrecheckRequest) -> pb.PrecheckResponse:
        try:
            if not message.function:
                raise _refuse(ErrorCode.INVALID_ARGUMENT, "function is required")
            args: list[Any] | None = None
            if message.args.strip():
                decoded = decode_args(message.args)
                if isinstance(decoded, str):
                    raise _refuse(ErrorCode.INVALID_ARGUMENT, decoded)
                args = decoded
            # Precheck needs the code only, not the executors.
            snapshot = self._view.current
            if snapshot is None or self._stopping:
                raise _refuse(ErrorCode.UNAVAILABLE, self._not_ready_text())
        except GRPCError as exc:
            self._metrics.outcome("Precheck", exc.status.name)
            raise
        result = precheck(snapshot, message.function, args)
        self._metrics.outcome("Precheck", "ok" if result.ok else str(result.failure))
        return pb.PrecheckResponse(
            ok=result.ok,
            failure_code="" if result.failure is None else result.failure.value,
            message=result.message,
            signature=result.signature,
            is_async=result.is_async,
            code_epoch=result.epoch,
        )

    # ---- internals ----------------------------------------------------------------------

    def _not_ready_text(self) -> str:
        if self._stopping:
            return "the Sync Invoker is shutting down; retry on another instance"
        return "the Sync Invoker is starting (executors or function code not ready); retry soon"

    def _validate(self, function: str, args: str, timeout_ms: int, call_id: str) -> _Request:
        if not function:
            raise _refuse(
                ErrorCode.INVALID_ARGUMENT, "function is required: the name of a function to run"
            )
        decoded = decode_args(args) if args.strip() else []
        if isinstance(decoded, str):
            raise _refuse(ErrorCode.INVALID_ARGUMENT, decoded)
        if timeout_ms < 0:
            raise _refuse(
                ErrorCode.INVALID_ARGUMENT,
                f"timeout_ms must be >= 0 (got {timeout_ms}; 0 = the server default, "
                f"{self._default_timeout_ms} ms)",
            )
        if timeout_ms > self._max_timeout_ms:
            raise _refuse(
                ErrorCode.INVALID_ARGUMENT,
                f"timeout_ms must be <= {self._max_timeout_ms} (MAX_INVOKE_TIMEOUT_MS; "
                f"got {timeout_ms})",
            )
        if len(call_id) > MAX_CALL_ID_CHARS:
            raise _refuse(
                ErrorCode.INVALID_ARGUMENT,
                f"call_id must be at most {MAX_CALL_ID_CHARS} characters (got {len(call_id)})",
            )
        return _Request(
            function=function,
            args=decoded,
            budget_ms=timeout_ms or self._default_timeout_ms,
            call_id=call_id or uuid.uuid4().hex,
        )

    async def _invoke(
        self, rpc: str, function: str, args: str, timeout_ms: int, call_id: str, debug: bool
    ) -> tuple[InvokeOutcome, InvokeObserver | None]:
        # Monotonic, microsecond wall time for durations (the Clock is for timestamps).
        started_ns = time.perf_counter_ns()
        try:
            request = self._validate(function, args, timeout_ms, call_id)
            if not self.ready:
                raise _refuse(ErrorCode.UNAVAILABLE, self._not_ready_text())
            if self.in_flight >= self._max_concurrent:
                raise _refuse(
                    ErrorCode.NO_SLOT,
                    f"{self.in_flight} invokes are running, the most this Sync Invoker takes "
                    "(SYNC_INVOKER_MAX_CONCURRENT); back off and retry",
                )
        except GRPCError as exc:
            self._metrics.outcome(rpc, exc.status.name)
            raise
        self.in_flight += 1
        self._idle.clear()
        try:
            outcome, observer = await self._run(request, debug, started_ns)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()
        self._metrics.invoked(rpc, outcome, (time.perf_counter_ns() - started_ns) / 1e9)
        return outcome, observer

    async def _run(
        self, request: _Request, debug: bool, started_ns: int
    ) -> tuple[InvokeOutcome, InvokeObserver | None]:
        # The call id is the caller's; the task id stays internal and unique, so two
        # invokes with the same call_id never collide in the dispatcher.
        task_id = f"invoke-{uuid.uuid4().hex}"
        try:
            snapshot = self._view.pin(task_id, self._clock.now_ms())
        except NoSnapshotError:
            raise _refuse(ErrorCode.UNAVAILABLE, self._not_ready_text()) from None
        # Functions are read-only here too: the scope refuses every write.
        scope = TaskIoScope(self._io, task_id)
        try:
            if snapshot.resolve(request.function) is None:
                wall_us = (time.perf_counter_ns() - started_ns) // 1000
                return InvokeOutcome(
                    call_id=request.call_id,
                    success=False,
                    failure_code=CallFailureKind.FUNCTION_NOT_FOUND.value,
                    failure_message=snapshot.describe_missing(request.function),
                    retryable=RETRYABLE[CallFailureKind.FUNCTION_NOT_FOUND],
                    queue_us=wall_us,
                    code_epoch=snapshot.epoch,
                ), None
            observer = InvokeObserver(request.budget_ms * 1000, debug)
            converged = await self.engine.run_calls(
                task_id,
                snapshot,
                scope,
                request.function,
                [request.args],
                observer=observer,
                debug=debug,
                budget_ms=request.budget_ms,
            )
            wall_us = (time.perf_counter_ns() - started_ns) // 1000
            return invoke_outcome(
                call_id=request.call_id,
                converged=converged,
                observer=observer,
                function=request.function,
                args=request.args,
                budget_ms=request.budget_ms,
                wall_us=wall_us,
                epoch=snapshot.epoch,
            ), observer
        finally:
            scope.close()
            self._view.unpin(task_id, self._clock.now_ms())


def _response(outcome: InvokeOutcome) -> pb.InvokeResponse:
    return pb.InvokeResponse(
        call_id=outcome.call_id,
        success=outcome.success,
        result=outcome.result,
        failure_code=outcome.failure_code,
        failure_message=outcome.failure_message,
        retryable=outcome.retryable,
        durations=pb.CallDurations(
            queue_us=outcome.queue_us, cpu_us=outcome.cpu_us, io_us=outcome.io_us
        ),
        code_epoch=outcome.code_epoch,
    )
