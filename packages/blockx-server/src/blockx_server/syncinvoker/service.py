"""syncinvoker.v1.SyncInvokerService over grpclib: one function call, answered on the spot.

``Invoke`` runs exactly one call through the Sync Invoker's own CallEngine as a
one-call task with a fresh internal task id, pinned to the current code epoch.
A function that fails is a normal answer (``success=false`` with the call's
failure kind); gRPC errors are only for a bad request (INVALID_ARGUMENT), a
server that is not ready or is stopping (UNAVAILABLE), overload
(RESOURCE_EXHAUSTED), and a chain it does not serve (FAILED_PRECONDITION: the
request's ``chain``, a BlockX addition, names one this server's configuration lacks,
or none where it serves several). ``DebugInvoke`` adds what the function printed or logged
and a trace of its IO requests. ``Precheck`` answers from the code alone
(``blockx_core.signature.precheck``); it never runs user code.

Durations come from the engine's CallObserver: ``cpu_us`` and ``io_us`` summed over
the invoke's calls (its sub-calls included), and ``queue_us`` is everything else
in the invoke's wall time (waiting for an executor, transport to it, loading the
module on an executor's first use of it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Final, assert_never

import msgspec
from grpclib.exceptions import GRPCError

from blockx_core.call_record import (
    DEFAULT_CALL_RECORD_MAX_BYTES,
    CallRecord,
    RecordedFailure,
    encode_record,
)
from blockx_core.calls import RootCall
from blockx_core.chains import CHAIN_NAME_RULE, is_chain_name
from blockx_core.code_view import CodeSnapshot, FunctionCodeView, NoSnapshotError
from blockx_core.dispatch import CallsConverged, CallsFailed, ConvergeTaskCalls
from blockx_core.errors import ErrorCode
from blockx_core.signature import precheck
from blockx_proto import syncinvoker_v1 as pb
from blockx_server.calls.engine import CallEngine
from blockx_server.calls.recording import RunRecords, failure_ending
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.status import SYNC_INVOKER_STATUS, status_error
from blockx_server.syncinvoker.convert import (
    debug_invoke_response,
    decode_args,
    invoke_response,
    precheck_response,
)
from blockx_server.syncinvoker.metrics import SyncInvokerMetrics
from blockx_server.syncinvoker.outcome import (
    InvokeObserver,
    InvokeOutcome,
    IoTraceRecord,
    invoke_outcome,
)

__all__ = [
    "InvokeObserver",
    "InvokeOutcome",
    "SyncInvokerService",
    "invoke_outcome",
]

MAX_CALL_ID_CHARS: Final = 128


def _refuse(code: ErrorCode, message: str) -> GRPCError:
    return status_error(SYNC_INVOKER_STATUS[code], message)


class _Request(msgspec.Struct, frozen=True, kw_only=True):
    function: str
    args: list[Any]
    budget_ms: int
    call_id: str
    # The chain the call reads; None when the server serves none.
    chain: str | None


class SyncInvokerService(pb.SyncInvokerServiceBase):
    def __init__(
        self,
        engine: CallEngine,
        view: FunctionCodeView,
        io: IoRouter,
        *,
        default_timeout_ms: int,
        max_timeout_ms: int,
        max_concurrent: int,
        metrics: SyncInvokerMetrics,
        clock: Clock = SYSTEM_CLOCK,
        record_max_bytes: int = DEFAULT_CALL_RECORD_MAX_BYTES,
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
        self._record_max_bytes = record_max_bytes
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
    def executors_up(self) -> int:
        return len(self.engine.pool.executor_ids())

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
        outcome, _, _ = await self._invoke(
            "Invoke",
            message.function,
            message.args,
            message.timeout_ms,
            message.call_id,
            message.chain,
            False,
        )
        return invoke_response(outcome)

    async def debug_invoke(self, message: pb.DebugInvokeRequest) -> pb.DebugInvokeResponse:
        outcome, observer, record = await self._invoke(
            "DebugInvoke",
            message.function,
            message.args,
            message.timeout_ms,
            message.call_id,
            message.chain,
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
        return debug_invoke_response(
            outcome,
            observer.output() if observer is not None else "",
            trace,
            b"" if record is None else encode_record(record, indent=0),
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
        return precheck_response(result)

    # ---- internals ----------------------------------------------------------------------

    def _not_ready_text(self) -> str:
        if self._stopping:
            return "the Sync Invoker is shutting down; retry on another instance"
        return "the Sync Invoker is starting (executors or function code not ready); retry soon"

    def _chain(self, name: str) -> str | None:
        """The chain an invoke reads: the one named (empty: the only one served)."""
        served = self._io.chain_names()
        if not name:
            if len(served) > 1:
                raise _refuse(
                    ErrorCode.CHAIN_NOT_SERVED,
                    f"this Sync Invoker serves several chains ({', '.join(served)}): "
                    "name one (chain)",
                )
            return served[0] if served else None
        if not is_chain_name(name):
            raise _refuse(
                ErrorCode.INVALID_ARGUMENT,
                f"chain must be a chain name: {CHAIN_NAME_RULE} (got {len(name)} characters)",
            )
        if name not in served:
            raise _refuse(
                ErrorCode.CHAIN_NOT_SERVED,
                f"this Sync Invoker does not serve chain {name!r} "
                f"(it serves: {', '.join(served) or 'none'})",
            )
        return name

    def _validate(
        self, function: str, args: str, timeout_ms: int, call_id: str, chain: str
    ) -> _Request:
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
            chain=self._chain(chain),
        )

    async def _invoke(
        self,
        rpc: str,
        function: str,
        args: str,
        timeout_ms: int,
        call_id: str,
        chain: str,
        debug: bool,
    ) -> tuple[InvokeOutcome, InvokeObserver | None, CallRecord | None]:
        # Monotonic, microsecond wall time for durations (the Clock is for timestamps).
        started_ns = time.perf_counter_ns()
        try:
            request = self._validate(function, args, timeout_ms, call_id, chain)
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
            outcome, observer, record = await self._run(request, debug, started_ns)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()
        seconds = (time.perf_counter_ns() - started_ns) / 1e9
        self._metrics.invoked(rpc, outcome, seconds, request.function)
        return outcome, observer, record

    async def _run(
        self, request: _Request, debug: bool, started_ns: int
    ) -> tuple[InvokeOutcome, InvokeObserver | None, CallRecord | None]:
        # The call id is the caller's; the task id stays internal and unique, so two
        # invokes with the same call_id never collide in the dispatcher.
        task_id = f"invoke-{uuid.uuid4().hex}"
        try:
            snapshot = self._view.pin(task_id, self._clock.now_ms())
        except NoSnapshotError:
            raise _refuse(ErrorCode.UNAVAILABLE, self._not_ready_text()) from None
        # Functions are read-only here too: the scope refuses every write. An invoke
        # reads its chain (others through io.router.chain(name)).
        scope = TaskIoScope(self._io, task_id, chain=request.chain, code_epoch=snapshot.epoch)
        try:
            # A function the snapshot lacks fails its call FUNCTION_NOT_FOUND in the
            # engine, as any other answer.
            observer = InvokeObserver(debug)
            # A debug invoke records its call (CALL_RECORD_MAX_BYTES), success or not.
            run = self.engine.open_calls(
                task_id,
                snapshot,
                scope,
                request.function,
                observer=observer,
                debug=debug,
                budget_ms=request.budget_ms,
                record_bytes=self._record_max_bytes if debug else 0,
                record_successes=True,
            )
            run.add([RootCall(request.args)])
            run.done()
            converged = await run.result()
            wall_us = (time.perf_counter_ns() - started_ns) // 1000
            record = (
                None
                if run.records is None
                else invoke_record(run.records, converged, request, snapshot)
            )
            return (
                invoke_outcome(
                    call_id=request.call_id,
                    converged=converged,
                    observer=observer,
                    wall_us=wall_us,
                    epoch=snapshot.epoch,
                ),
                observer,
                record,
            )
        finally:
            scope.close()
            self._view.unpin(task_id, self._clock.now_ms())


def invoke_record(
    records: RunRecords, converged: ConvergeTaskCalls, request: _Request, snapshot: CodeSnapshot
) -> CallRecord | None:
    """The record of an invoke's one call; None for a run that failed as a whole
    (OUTPUT_BYTES_EXCEEDED) or whose function is missing (it never ran)."""
    ending: RecordedFailure | bytes
    match converged:
        case CallsConverged(outputs=outputs):
            ending = outputs[0].value_json
        case CallsFailed(failed_call=failed):
            if failed is None:
                return None
            ending = failure_ending(failed)
        case _:
            assert_never(converged)
    return records.record(
        0,
        function=request.function,
        snapshot=snapshot,
        chain=request.chain or "",
        ending=ending,
        args=request.args,
    )
