"""The executor process: runs user functions for one Worker over one Unix socket.

``python -m blockx_executor --socket PATH --executor-id ID`` connects to its Worker,
says Hello, and then serves frames until the connection closes:

* ``LoadCode`` registers a module's source; it is compiled (and its top level run)
  once per digest, on first use, and cached.
* ``ExecuteCalls`` runs calls in order. A ``def`` function runs to completion. An
  ``async def`` function runs until it awaits ``io.*`` or ``call(...)``; it is then
  suspended (an ``IoRequested`` / ``SubCallRequested`` goes out) and the next call
  runs. ``ResumeCall`` continues it; ``CancelCalls`` closes it.
* Results leave as JSON texts, batched into one ``CallsCompleted`` per frame.
* What a call prints goes with its suspension or outcome as ``CallOutput``
  (``capture.py``), bounded per call.
* A call the Worker traces (its entry in ``ExecuteCalls.traces``) is timed from
  its first entry to its outcome, and a ``CallTraced`` goes out with the outcome
  (``traced_calls.py``).

There is no event loop: coroutines are driven by hand with ``send`` / ``throw``,
which is cheaper than asyncio and makes "only BlockX awaitables" enforceable.

Budget: each call may use ``budget_us`` of CPU (this thread's CPU clock, so
queueing and other processes do not count) plus IO backend time (reported by
the Worker in ``ResumeCall``). A call that ends over budget fails. A call that
never ends is stopped by the Worker, which reads this thread's CPU from the kernel
and kills the process; the heartbeat thread only says which call runs.
"""

from __future__ import annotations

import contextvars
import os
import socket
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any, Final, assert_never

import msgspec

from blockx_executor.api import (
    CallError,
    CallInfo,
    IoError,
    IoRequest,
    SubCallRequest,
    _current_call,
)
from blockx_executor.capture import CallOutputs, debug_logging
from blockx_executor.code import CodeCache, Unavailable, describe
from blockx_executor.heartbeat import heartbeat_loop
from blockx_executor.integrity import IntegrityCheck, fail_and_stop
from blockx_executor.no_event_loop import NO_EVENT_LOOP
from blockx_executor.protocol import (
    CallContext,
    CallFailed,
    CallsCompleted,
    CancelCalls,
    ExecuteCalls,
    FailureKind,
    FrameDecoder,
    FrameEncoder,
    Hello,
    IoRequested,
    LoadCode,
    ResumeCall,
    SubCallRequested,
    ToExecutor,
    printable,
)
from blockx_executor.results import JSON_SCALARS, json_problem
from blockx_executor.suspended import NOT_AWAITABLE, SuspendedCall, close_quietly
from blockx_executor.traced_calls import OpenSpans, finished_span, open_span

# Flush completions at least this often while working through a long batch.
_FLUSH_EVERY_NS: Final = 10_000_000
_FLUSH_EVERY_CALLS: Final = 1024
_RECV_BYTES: Final = 4 * 1024 * 1024
_thread_time_ns = time.thread_time_ns
_perf_counter_ns = time.perf_counter_ns
_COROUTINE: Final = types.CoroutineType


class Runner:
    """Serves one Worker connection. Single-threaded except for the heartbeat thread."""

    def __init__(
        self,
        sock: socket.socket,
        executor_id: str,
        heartbeat_interval_s: float,
        outputs: CallOutputs | None = None,
    ) -> None:
        self._sock = sock
        self._executor_id = executor_id
        self._heartbeat_interval_s = heartbeat_interval_s
        self._send_lock = threading.Lock()
        self._encoder = FrameEncoder()
        self._decoder: FrameDecoder[ToExecutor] = FrameDecoder(ToExecutor)
        self._json = msgspec.json.Encoder()
        self._json_decode = msgspec.json.Decoder().decode
        self._code = CodeCache()
        self._suspended: dict[int, SuspendedCall] = {}
        # What calls print (this process's sys.stdout and sys.stderr write into it).
        self._outputs = outputs or CallOutputs(0)
        # Debug calls (their logging is part of their output) that have not ended.
        self._debug: set[int] = set()
        # Traced calls (ExecuteCalls.traces) that have not ended yet.
        self._spans: OpenSpans = {}
        # Outgoing, flushed as one frame: completions as columns, the rest as messages.
        self._done_ids: list[int] = []
        self._done_results: list[bytes] = []
        self._done_cpu: list[int] = []
        self._done_io: list[int] = []
        self._out: list[Any] = []
        self._last_flush_ns = 0
        # (call_id, CPU clock at segment start, budget consumed before the segment),
        # read by the heartbeat thread; one reference assignment, so no lock.
        self._running: tuple[int, int, int] | None = None
        self._stopped = threading.Event()
        # Set by the process before user code runs; checked before results leave.
        self.integrity: IntegrityCheck | None = None

    # ---- the loop ------------------------------------------------------------------

    def serve(self) -> None:
        self._send([Hello(self._executor_id, os.getpid())])
        beat = threading.Thread(
            target=heartbeat_loop,
            args=(
                self._sock,
                self._send_lock,
                self._heartbeat_interval_s,
                self._stopped,
                lambda: (self._running, len(self._suspended)),
            ),
            name="heartbeat",
            daemon=True,
        )
        beat.start()
        try:
            while True:
                data = self._sock.recv(_RECV_BYTES)
                if not data:
                    return  # the Worker closed the connection: nothing left to do
                self._last_flush_ns = _perf_counter_ns()
                for message in self._decoder.feed(data):
                    self._handle(message)
                self._flush()
        finally:
            self._stopped.set()

    def _handle(self, message: ToExecutor) -> None:
        match message:
            case ExecuteCalls():
                self._execute(message)
            case ResumeCall():
                self._resume(message)
            case LoadCode():
                self._code.load(message)
            case CancelCalls():
                for call_id in message.call_ids:
                    suspended = self._suspended.pop(call_id, None)
                    if suspended is not None:
                        close_quietly(suspended)
                    self._outputs.forget(call_id)
                    self._debug.discard(call_id)
                    self._spans.pop(call_id, None)
            case _:
                assert_never(message)

    # ---- running calls ---------------------------------------------------------------

    def _execute(self, batch: ExecuteCalls) -> None:
        entry = self._code.function(batch.digest, batch.function)
        if isinstance(entry, Unavailable):
            for call_id in batch.call_ids:
                self._out.append(CallFailed(call_id, entry.kind, entry.message))
            return
        budget_ns = batch.budget_us * 1000
        task_id = batch.task_id
        function = batch.function
        n = len(batch.call_ids)
        kwargs_column: Sequence[dict[str, Any] | None] = [None] * n
        if batch.kwargs is not None:
            kwargs_column = batch.kwargs
        contexts: list[CallContext | None] = batch.contexts or [None] * n
        traced = None
        if batch.traces is not None:
            traced = {c: t for c, t in zip(batch.call_ids, batch.traces, strict=True) if t}
        # The thread's CPU clock is a system call: a sync call's end is the next one's
        # start, so each call reads it once (and is charged the runner's work between
        # two calls, about a microsecond). A flush reads it afresh.
        start = self._start_async if entry.is_async else self._run_sync
        fn = entry.fn
        debug = batch.debug
        clock = _thread_time_ns()
        for call_id, args, kwargs, context in zip(
            batch.call_ids, batch.args, kwargs_column, contexts, strict=True
        ):
            if context is None:
                info = CallInfo(call_id, task_id, function)
            else:
                info = CallInfo(
                    call_id, task_id, function, context.block_number, context.block_hash
                )
            if traced is not None and call_id in traced:
                open_span(self._spans, call_id, traced[call_id])
            if debug:
                self._debug.add(call_id)
                self._outputs.debug(call_id)
                with debug_logging():
                    clock = start(call_id, fn, args, kwargs or None, budget_ns, info, clock)
            else:
                clock = start(call_id, fn, args, kwargs or None, budget_ns, info, clock)
            if (
                len(self._done_ids) >= _FLUSH_EVERY_CALLS
                or _perf_counter_ns() - self._last_flush_ns > _FLUSH_EVERY_NS
            ):
                self._flush()
                clock = _thread_time_ns()

    def _emit_output(self, call_id: int, *, ended: bool) -> None:
        output = self._outputs.take(call_id, ended=ended)
        if output is not None:
            self._out.append(output)
        if ended and self._debug:
            self._debug.discard(call_id)

    def _run_sync(
        self,
        call_id: int,
        fn: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any] | None,
        budget_ns: int,
        info: CallInfo,
        started: int,
    ) -> int:
        """Run a def function's call; ``started`` is the thread's CPU clock now, the
        result its value when the call has been dealt with."""
        token = _current_call.set(info)
        self._running = (call_id, started, 0)
        outputs = self._outputs
        outputs.current = call_id
        try:
            value = fn(*args) if kwargs is None else fn(*args, **kwargs)
        except BaseException as exc:
            self._running = None
            outputs.current = 0
            _current_call.reset(token)
            self._fail(call_id, FailureKind.USER_ERROR, describe(exc), _thread_time_ns() - started)
            return _thread_time_ns()  # describing the exception is not the next call's
        ended = _thread_time_ns()
        cpu_ns = ended - started
        self._running = None
        outputs.current = 0
        _current_call.reset(token)
        if type(value) is _COROUTINE:
            # A plain def that returned a coroutine: drive it like an async def.
            suspended = SuspendedCall(call_id, value, contextvars.copy_context(), budget_ns)
            suspended.ctx.run(_current_call.set, info)
            suspended.consumed_ns = cpu_ns
            self._step(suspended, None, None)
            return _thread_time_ns()
        self._complete(call_id, value, cpu_ns, 0, budget_ns)
        return ended

    def _start_async(
        self,
        call_id: int,
        fn: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any] | None,
        budget_ns: int,
        info: CallInfo,
        _clock: int,
    ) -> int:
        """Start an async def function's call (it reads the clock itself, per step);
        the result is the thread's CPU clock when it has suspended or ended."""
        ctx = contextvars.copy_context()
        ctx.run(_current_call.set, info)
        try:
            coro = ctx.run(fn, *args) if kwargs is None else ctx.run(fn, *args, **kwargs)
        except BaseException as exc:  # wrong arguments for the signature
            self._fail(call_id, FailureKind.USER_ERROR, describe(exc), 0)
            return _thread_time_ns()
        self._step(SuspendedCall(call_id, coro, ctx, budget_ns), None, None)
        return _thread_time_ns()

    def _step(self, call: SuspendedCall, value: Any, error: BaseException | None) -> None:
        """Run a coroutine until it suspends on a BlockX awaitable or finishes."""
        started = _thread_time_ns()
        self._running = (call.call_id, started, call.consumed_ns)
        outputs = self._outputs
        outputs.current = call.call_id
        send = call.coro.send
        run = call.ctx.run
        try:
            with NO_EVENT_LOOP:
                while True:
                    request = run(send, value) if error is None else run(call.coro.throw, error)
                    if isinstance(request, IoRequest | SubCallRequest):
                        break
                    value, error = None, TypeError(NOT_AWAITABLE.format(request))
        except StopIteration as stop:
            self._running = None
            outputs.current = 0
            cpu_ns = call.consumed_ns - call.io_ns + (_thread_time_ns() - started)
            self._complete(call.call_id, stop.value, cpu_ns, call.io_ns, call.budget_ns)
            return
        except BaseException as exc:
            self._running = None
            outputs.current = 0
            cpu_ns = call.consumed_ns - call.io_ns + (_thread_time_ns() - started)
            if isinstance(exc, IoError):
                # The Worker must not retry, nor report retryable, a read that fails
                # the same way every time.
                self._fail(
                    call.call_id,
                    FailureKind.IO_ERROR,
                    describe(exc),
                    cpu_ns,
                    call.io_ns,
                    retryable=exc.retryable,
                )
            else:
                self._fail(call.call_id, FailureKind.USER_ERROR, describe(exc), cpu_ns, call.io_ns)
            return
        self._running = None
        outputs.current = 0
        call.consumed_ns += _thread_time_ns() - started
        if call.consumed_ns > call.budget_ns:
            close_quietly(call)
            self._fail_budget(call.call_id, call.consumed_ns, call.budget_ns, call.io_ns)
            return
        if outputs.pending:
            self._emit_output(call.call_id, ended=False)
        self._suspended[call.call_id] = call
        if isinstance(request, IoRequest):
            call.waiting_io = True
            self._out.append(
                IoRequested(
                    call.call_id, request.backend, request.op, list(request.args), request.kwargs
                )
            )
        else:
            call.waiting_io = False
            self._out.append(
                SubCallRequested(call.call_id, request.function, request.args, request.kwargs)
            )

    def _resume(self, message: ResumeCall) -> None:
        call = self._suspended.pop(message.call_id, None)
        if call is None:
            return  # cancelled meanwhile
        io_ns = message.io_us * 1000
        call.io_ns += io_ns
        call.consumed_ns += io_ns
        if call.consumed_ns > call.budget_ns:
            close_quietly(call)
            self._fail_budget(call.call_id, call.consumed_ns, call.budget_ns, call.io_ns)
            return
        value: Any = None
        error: BaseException | None = None
        if message.ok:
            try:
                value = self._json_decode(message.value_json)
            except msgspec.DecodeError as exc:
                error = IoError("BAD_ANSWER", f"undecodable answer: {exc}")
        else:
            error_type = IoError if call.waiting_io else CallError
            error = error_type(message.error_kind, message.error, retryable=message.retryable)
        if call.call_id in self._debug:
            with debug_logging():
                self._step(call, value, error)
        else:
            self._step(call, value, error)

    def _complete(self, call_id: int, value: Any, cpu_ns: int, io_ns: int, budget_ns: int) -> None:
        if self._outputs.pending:
            self._emit_output(call_id, ended=True)
        if cpu_ns + io_ns > budget_ns:
            self._fail_budget(call_id, cpu_ns + io_ns, budget_ns, io_ns)
            return
        try:
            result = self._json.encode(value)
            problem = None if type(value) in JSON_SCALARS else json_problem(value, result)
        except (TypeError, ValueError, OverflowError) as exc:
            problem = str(exc)
        if problem is not None:
            self._fail(
                call_id,
                FailureKind.BAD_RESULT,
                f"the return value is not JSON data: {problem}",
                cpu_ns,
                io_ns,
            )
            return
        self._done_ids.append(call_id)
        self._done_results.append(result)
        self._done_cpu.append(cpu_ns // 1000)
        self._done_io.append(io_ns // 1000)
        if self._spans:
            self._end_span(call_id, "")

    def _fail(
        self,
        call_id: int,
        kind: FailureKind,
        message: str,
        cpu_ns: int,
        io_ns: int = 0,
        *,
        retryable: bool = True,
    ) -> None:
        if self._outputs.pending:
            self._emit_output(call_id, ended=True)
        self._out.append(
            CallFailed(call_id, kind, message, cpu_ns // 1000, io_ns // 1000, retryable)
        )
        if self._spans:
            self._end_span(call_id, kind)

    def _end_span(self, call_id: int, failure_kind: str) -> None:
        opened = self._spans.pop(call_id, None)
        if opened is not None:
            self._out.append(finished_span(call_id, opened, failure_kind))

    def _fail_budget(self, call_id: int, used_ns: int, budget_ns: int, io_ns: int) -> None:
        self._fail(
            call_id,
            FailureKind.BUDGET_EXCEEDED,
            f"the call used {used_ns // 1_000_000} ms of CPU and IO time, over its budget of "
            f"{budget_ns // 1_000_000} ms",
            used_ns - io_ns,
            io_ns,
        )

    # ---- the wire --------------------------------------------------------------------

    def _flush(self) -> None:
        if not self._done_ids and not self._out:
            self._last_flush_ns = _perf_counter_ns()
            return  # nothing leaves: nothing to check
        changed = None if self.integrity is None else self.integrity.changed()
        if changed is not None:
            fail_and_stop(self._sock, self._send_lock, [*self._done_ids, *self._out], changed)
        out = self._out
        if self._done_ids:
            out.append(
                CallsCompleted(self._done_ids, self._done_results, self._done_cpu, self._done_io)
            )
            self._done_ids, self._done_results, self._done_cpu, self._done_io = [], [], [], []
        if out:
            self._out = []
            self._send(out)
        self._last_flush_ns = _perf_counter_ns()

    def _send(self, messages: list[Any]) -> None:
        frame, unsendable = self._encoder.encode_sendable(messages)
        if frame:
            with self._send_lock:
                self._sock.sendall(frame)
        if unsendable:
            # What cannot be encoded fails its own call: the rest of the frame went.
            for message, reason in unsendable:
                self._cannot_send(message, reason)
            out, self._out = self._out, []
            if out:
                self._send(out)

    def _cannot_send(self, message: Any, reason: str) -> None:
        """``message`` could not be encoded: a suspended call whose request it was
        fails (its arguments would fail the same way every time); anything else
        (a span) is dropped."""
        if not isinstance(message, IoRequested | SubCallRequested):
            return
        call = self._suspended.pop(message.call_id, None)
        if call is None:
            return
        close_quietly(call)
        if isinstance(message, IoRequested):
            request = repr(IoRequest(message.backend, message.op, message.args, message.kwargs))
        else:
            request = repr(SubCallRequest(message.function, message.args, message.kwargs))
        self._fail(
            message.call_id,
            FailureKind.BAD_ARGUMENTS,
            f"{printable(request)}: its arguments cannot be sent to the Worker: {reason}",
            call.consumed_ns - call.io_ns,
            call.io_ns,
            retryable=False,
        )
