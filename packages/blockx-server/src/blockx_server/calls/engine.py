r"""CallEngine: drives the DispatcherCore with an ExecutorPool, the tasks' IO scopes
and the Function Code View. This is the Calls phase of a task, as the Worker and
the Sync Invoker run it.

``open_calls(task_id, snapshot, io, function)`` starts the phase and returns a
``CallRun``: a producer ``add``\ s root calls as they come (awaiting ``wait_room``
to stay within a call window of the dispatcher) and says ``done``;
``await run.result()`` gives the phase's ``ConvergeTaskCalls``. ``run_calls`` does
all of it for a list known up front. Every IO request of the calls goes through
``io``, the task's scope. Everything happens on one event loop: executor frames are
decoded in ``data_received``, fed to the core, and the commands it returns are
turned into messages that are buffered per executor and flushed once per loop
iteration, so one frame carries everything that became ready together. A call
whose arguments cannot be encoded is left out of its frame and fails alone
(BAD_ARGUMENTS); a module counts as loaded on an executor once the frame with its
``LoadCode`` was written.

The executors' CPU is read from the kernel at every frame and whenever the core's
deadline falls due (``_on_timer``): a call holding the GIL starves the executor's
heartbeat, never the kernel's count of its CPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, assert_never

import msgspec

from blockx_core.calls import RootCall, RootOutputs
from blockx_core.code_view import CodeSnapshot, FunctionSource
from blockx_core.dispatch import (
    AbortCall,
    CallsConverged,
    CallsFailed,
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    DispatchConfig,
    DispatcherCore,
    KillExecutor,
    ResumeWithIo,
    ResumeWithResult,
    RetireExecutor,
    SendCalls,
)
from blockx_core.failures import CallFailureKind, Failure, call_failure_kind
from blockx_executor import protocol as wire
from blockx_server.calls.call_logs import CallLogs
from blockx_server.calls.call_spans import CallSpans
from blockx_server.calls.cpu_clock import ExecutorGauge
from blockx_server.calls.executor_pool import ExecutorPool, ExecutorPoolConfig
from blockx_server.calls.load_check import load_code
from blockx_server.calls.messages import (
    execute_calls,
    resume_with_io,
    resume_with_result,
    trace_message,
)
from blockx_server.calls.recording import RunRecords
from blockx_server.calls.run import CallObserver, CallRun, RunState, observe
from blockx_server.io.errors import IoFailed, IoOutcome
from blockx_server.io.scope import TaskIoScope
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.timer import DeadlineTimer

log = logging.getLogger(__name__)


class CallEngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    dispatch: DispatchConfig = DispatchConfig()
    pool: ExecutorPoolConfig = ExecutorPoolConfig()
    # Calls traced per task (the first ones dispatched), when its trace is sampled.
    trace_calls_per_task: int = 10


class CallEngine:
    def __init__(
        self,
        config: CallEngineConfig,
        clock: Clock = SYSTEM_CLOCK,
        *,
        spans: CallSpans | None = None,
    ) -> None:
        self._config = config
        self._spans = spans or CallSpans(config.trace_calls_per_task)
        self._core = DispatcherCore(config.dispatch)
        self._pool = ExecutorPool(config.pool, self)
        self._logs = CallLogs(config.pool.max_log_bytes)
        self._clock = clock
        self._sources: dict[str, FunctionSource] = {}  # digest -> module source
        self._loaded: dict[str, set[str]] = {}  # executor -> digests written to it
        self._loading: dict[str, set[str]] = defaultdict(set)  # ... in its outbox
        self._encoder = wire.FrameEncoder()
        self._gauges: dict[str, ExecutorGauge] = {}  # executor -> its kernel accounting
        self._outbox: dict[str, list[Any]] = defaultdict(list)
        self._flush_scheduled = False
        self._runs: dict[str, RunState] = {}
        self._timer = DeadlineTimer(clock, self._on_timer)
        self._io_tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._observed = 0  # runs with an observer: only then are calls mapped to runs
        self._room_waiters: dict[str, RunState] = {}  # producers waiting in wait_room()
        # IO answers the core is deciding on: ResumeWithIo sends one (by call id).
        self._io_answers: dict[int, wire.ResumeCall] = {}
        # Root call id -> the records of its run, for the root calls being recorded
        # (those that made an IO request): empty unless some run records.
        self._recorded: dict[int, RunRecords] = {}

    @property
    def core(self) -> DispatcherCore:
        return self._core

    @property
    def pool(self) -> ExecutorPool:
        return self._pool

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._pool.start()

    async def wait_ready(self) -> None:
        await self._pool.wait_ready()

    async def close(self) -> None:
        for task_id in list(self._runs):
            self._apply(self._core.cancel_task(task_id, self._clock.now_ms()))
        for task in list(self._io_tasks):
            task.cancel()
        self._timer.cancel()
        await self._pool.close()
        for gauge in self._gauges.values():
            gauge.close()
        self._gauges.clear()

    def open_calls(
        self,
        task_id: str,
        snapshot: CodeSnapshot,
        io: TaskIoScope,
        function: str,
        *,
        observer: CallObserver | None = None,
        debug: bool = False,
        budget_ms: int | None = None,
        record_bytes: int = 0,
        record_successes: bool = False,
    ) -> CallRun:
        """Start a Calls phase whose root calls come later, through the returned
        run's ``add``; ``done`` says no more will come.

        An ``observer`` sees each call's durations and IO; ``debug`` captures what
        the calls print; ``budget_ms`` replaces CALL_DEADLINE_MS as this run's
        per-call budget. ``record_bytes`` > 0 records each root call's IO up to that
        many bytes (``CallRun.records``): kept for the root call that fails the run,
        and for those that succeed too with ``record_successes``. Cancelling the
        coroutine awaiting ``result()`` cancels the task's calls.
        """
        if task_id in self._runs:
            raise RuntimeError(f"task {task_id!r} is already in its Calls phase")
        loop = asyncio.get_running_loop()
        records = (
            RunRecords(record_bytes, keep_successes=record_successes) if record_bytes > 0 else None
        )
        run = RunState(loop.create_future(), snapshot, io, observer, debug, records)
        source = snapshot.resolve(function)
        if source is not None:
            self._sources[source.digest] = source
        self._runs[task_id] = run
        self._spans.open_run(task_id)
        if observer is not None:
            self._observed += 1
        core, now_ms = self._core, self._clock.now_ms()
        digest = "" if source is None else source.digest
        commands = core.open_task(task_id, digest, function, now_ms, budget_ms=budget_ms)
        if source is None:
            commands += core.function_missing(task_id, snapshot.describe_missing(function), now_ms)
        self._apply(commands)
        run.usage = core.usage(task_id)
        return CallRun(self, task_id, run)

    async def run_calls(
        self,
        task_id: str,
        snapshot: CodeSnapshot,
        io: TaskIoScope,
        function: str,
        calls: Sequence[RootCall | list[Any]],
        *,
        observer: CallObserver | None = None,
        debug: bool = False,
        budget_ms: int | None = None,
        record_bytes: int = 0,
        record_successes: bool = False,
    ) -> ConvergeTaskCalls:
        """Run one root call per entry of ``calls`` (a RootCall, or the list of a
        call's positional arguments); return how the phase converged. The keyword
        arguments are those of ``open_calls``."""
        run = self.open_calls(
            task_id,
            snapshot,
            io,
            function,
            observer=observer,
            debug=debug,
            budget_ms=budget_ms,
            record_bytes=record_bytes,
            record_successes=record_successes,
        )
        run.add(calls)
        run.done()
        return await run.result()

    # ---- CallRun -------------------------------------------------------------------

    def add_roots(self, task_id: str, roots: Sequence[RootCall | list[Any]]) -> None:
        self._apply(self._core.add_roots(task_id, roots, self._clock.now_ms()))

    def roots_done(self, task_id: str) -> None:
        self._apply(self._core.roots_done(task_id, self._clock.now_ms()))

    def take_outputs(self, task_id: str) -> RootOutputs:
        return self._core.take_outputs(task_id)

    async def wait_room(self, task_id: str, run: RunState, *, progress: bool = False) -> None:
        counts = self._core.task_progress(task_id)
        run.done_from = counts[0] if progress and counts is not None else None
        try:
            if self._has_room(task_id, run):
                return
            waiter = asyncio.get_running_loop().create_future()
            run.room = waiter
            self._room_waiters[task_id] = run
            try:
                await waiter
            finally:
                run.room = None
                if self._room_waiters.get(task_id) is run:
                    del self._room_waiters[task_id]
        finally:
            run.done_from = None

    def has_room(self, task_id: str, run: RunState) -> bool:
        return self._has_room(task_id, run)

    def _has_room(self, task_id: str, run: RunState) -> bool:
        core = self._core
        if self._runs.get(task_id) is not run or run.future.done() or not core.has_task(task_id):
            return True  # the run has ended: the producer stops waiting and sees it
        pending = core.task_pending(task_id)
        if run.done_from is not None and run.done_from < core.task_done(task_id):
            return True  # some root call finished: what the producer waited for
        return pending <= core.task_window(task_id)

    def _wake_producers(self) -> None:
        for task_id, run in list(self._room_waiters.items()):
            if self._has_room(task_id, run):
                del self._room_waiters[task_id]
                if run.room is not None and not run.room.done():
                    run.room.set_result(None)

    def close_run(self, task_id: str, run: RunState) -> None:
        if self._runs.get(task_id) is not run:
            return
        del self._runs[task_id]
        self._spans.close_run(task_id)
        if run.observer is not None:
            self._observed -= 1
        if run.records is not None:
            self._forget_recordings(run.records)
        if self._core.has_task(task_id):
            self._apply(self._core.cancel_task(task_id, self._clock.now_ms()))
        if self._room_waiters:
            self._wake_producers()  # a producer of this run stops waiting

    # ---- PoolListener ---------------------------------------------------------------

    def executor_up(self, executor_id: str) -> None:
        self._loaded[executor_id] = set()
        pid = self._pool.pid(executor_id)
        if pid is not None:
            self._gauges[executor_id] = ExecutorGauge(pid)
        self._apply(self._core.executor_up(executor_id, self._clock.now_ms()))

    def executor_gone(self, executor_id: str, reason: str) -> None:
        if self._spans.live:
            self._spans.executor_ended(executor_id, CallFailureKind.EXECUTOR_LOST.value, reason)
        self._spans.executor_gone(executor_id)
        self._logs.executor_gone(executor_id)
        self._forget_executor(executor_id)
        self._apply(self._core.executor_lost(executor_id, reason, self._clock.now_ms()))

    def executor_output(self, executor_id: str, data: bytes) -> None:
        call_id = self._core.holding_call(executor_id)
        task_id = self._core.call_task(call_id) if call_id else None
        self._logs.raw(executor_id, data, call_id, task_id)

    def executor_messages(self, executor_id: str, messages: list[wire.FromExecutor]) -> None:
        core = self._core
        now_ms = self._clock.now_ms()
        # A frame boundary: sample the executor's CPU from the kernel before its
        # messages say which calls stopped holding it (and its memory on heartbeats).
        gauge = self._gauges.get(executor_id)
        commands: list[DispatchCommand] = []
        if gauge is not None:
            beat = any(type(m) is wire.ExecutorHeartbeat for m in messages)
            commands += self._sample(executor_id, gauge, now_ms, memory=beat)
        spans = self._spans
        for message in messages:
            if self._observed:
                observe(message, self._observer_of)
            if spans.live:
                trace_message(spans, message)
            match message:
                case wire.CallsCompleted():
                    if self._logs.open:
                        self._logs.ended(message.call_ids)
                    if self._recorded:
                        self._recorded_success(message)
                    commands += core.calls_completed(
                        executor_id, message.call_ids, message.results, now_ms
                    )
                case wire.CallFailed():
                    if self._logs.open:
                        self._logs.ended((message.call_id,))
                    commands += core.call_failed(
                        executor_id,
                        message.call_id,
                        call_failure_kind(message.kind),
                        message.message,
                        now_ms,
                        retryable=message.retryable,
                    )
                case wire.ExecutorHeartbeat():
                    commands += core.executor_heartbeat(
                        executor_id, message.running_call, message.running_us, now_ms
                    )
                case wire.IoRequested():
                    core.call_suspended(executor_id, message.call_id, now_ms)
                    task = asyncio.create_task(self._serve_io(executor_id, message))
                    self._io_tasks.add(task)
                    task.add_done_callback(self._io_tasks.discard)
                case wire.SubCallRequested():
                    core.call_suspended(executor_id, message.call_id, now_ms)
                    commands += self._subcall(executor_id, message, now_ms)
                case wire.CallTraced():
                    spans.executor_span(executor_id, self._pool.pid(executor_id), message)
                case wire.CallOutput():
                    task_id = core.call_task(message.call_id)
                    self._logs.output(
                        executor_id, message.call_id, task_id, message.text, message.dropped
                    )
                case wire.Hello():
                    pass
                case _:
                    assert_never(message)
        self._apply(commands)

    def _observer_of(self, call_id: int) -> CallObserver | None:
        task_id = self._core.call_task(call_id)
        run = self._runs.get(task_id) if task_id is not None else None
        return None if run is None else run.observer

    # ---- internals ----------------------------------------------------------------------

    def _subcall(
        self, executor_id: str, message: wire.SubCallRequested, now_ms: int
    ) -> list[DispatchCommand]:
        task_id = self._core.call_task(message.call_id)
        run = self._runs.get(task_id) if task_id is not None else None
        if run is None:
            return []
        # Sub-calls resolve in the parent task's pinned epoch.
        source = run.snapshot.resolve(message.function)
        if source is None:
            missing = run.snapshot.describe_missing(message.function)
            return self._core.subcall_unresolved(executor_id, message.call_id, missing, now_ms)
        self._sources[source.digest] = source
        if run.records is not None:
            run.records.modules.add(source.module)
        return self._core.subcall_requested(
            executor_id,
            message.call_id,
            source.digest,
            message.function,
            message.args,
            now_ms,
            kwargs=message.kwargs,
        )

    async def _serve_io(self, executor_id: str, request: wire.IoRequested) -> None:
        task_id = self._core.call_task(request.call_id)
        run = self._runs.get(task_id) if task_id is not None else None
        if run is None:
            return  # the call's task has converged; nobody waits for this answer
        outcome = await run.io.request(request.backend, request.op, request.args, request.kwargs)
        if self._observed:
            observer = self._observer_of(request.call_id)
            if observer is not None:
                observer.io_traced(request.call_id, request, outcome)
        records = run.records
        if records is not None and not run.future.done():
            root = self._core.root_call(request.call_id)
            if root is not None:
                records.io(root, request, outcome)
                self._recorded[root[0]] = records
        # The core decides what the answer does (``ResumeWithIo`` sends it).
        self._io_answers[request.call_id] = resume_with_io(request.call_id, outcome)
        try:
            self._apply(
                self._core.io_answered(
                    executor_id,
                    request.call_id,
                    self._clock.now_ms(),
                    io_us=outcome.io_us,
                    failure=_io_failure(outcome),
                )
            )
        finally:
            self._io_answers.pop(request.call_id, None)

    def _apply(self, commands: list[DispatchCommand]) -> None:
        for command in commands:
            match command:
                case SendCalls():
                    self._send_calls(command)
                case CancelCalls():
                    self._outbox[command.executor_id].append(wire.CancelCalls(command.call_ids))
                    if self._logs.open:
                        self._logs.ended(command.call_ids)
                    if self._spans.live:
                        self._spans.cancelled(command.call_ids)
                case ResumeWithResult():
                    self._outbox[command.executor_id].append(resume_with_result(command))
                case ResumeWithIo():
                    answer = self._io_answers.pop(command.call_id, None)
                    if answer is not None:
                        self._outbox[command.executor_id].append(answer)
                case AbortCall():
                    call_ids = [command.call_id]
                    self._outbox[command.executor_id].append(wire.CancelCalls(call_ids))
                    if self._logs.open:
                        self._logs.ended(call_ids)
                    if self._spans.live:
                        failure = command.failure
                        self._spans.failed(command.call_id, failure.kind.value, failure.message)
                case KillExecutor():
                    if self._spans.live:
                        self._spans.killed(command)
                    self._forget_executor(command.executor_id)
                    self._pool.kill(command.executor_id, command.reason)
                case RetireExecutor():
                    self._forget_executor(command.executor_id)
                    self._pool.retire(command.executor_id, command.reason)
                case CallsConverged() | CallsFailed():
                    run = self._runs.get(command.task_id)
                    self._spans.close_run(command.task_id)
                    if run is not None and not run.future.done():
                        if run.observer is not None:
                            run.observer.calls_measured(run.usage)
                        if run.records is not None:
                            if type(command) is CallsFailed and command.failed_call is not None:
                                run.records.failed(command.failed_call)
                            self._forget_recordings(run.records)
                        run.future.set_result(command)
                case _:
                    assert_never(command)
        if self._room_waiters:
            self._wake_producers()
        if self._outbox:
            self._schedule_flush()
        self._arm_timer()

    def _forget_executor(self, executor_id: str) -> None:
        self._outbox.pop(executor_id, None)
        self._loaded.pop(executor_id, None)
        self._loading.pop(executor_id, None)
        gauge = self._gauges.pop(executor_id, None)
        if gauge is not None:
            gauge.close()

    def _send_calls(self, command: SendCalls) -> None:
        executor_id = command.executor_id
        if self._recorded:
            self._resent(command.call_ids)
        messages = self._outbox[executor_id]
        loaded = self._loaded.get(executor_id)
        if loaded is not None and command.code not in loaded:
            loading = self._loading[executor_id]
            if command.code not in loading:
                messages.append(load_code(self._sources[command.code]))
                loading.add(command.code)
        run = self._runs.get(command.task_id)
        traces = (
            self._spans.traces(command, self._core.parent_call) if self._spans.tracing else None
        )
        messages.append(execute_calls(command, run is not None and run.debug, traces))

    def _resent(self, call_ids: list[int]) -> None:
        """Root calls sent again (a retry, or their executor ended) start their
        records afresh."""
        recorded = self._recorded
        for call_id in call_ids:
            records = recorded.pop(call_id, None)
            if records is not None:
                records.resent(call_id)

    def _recorded_success(self, message: wire.CallsCompleted) -> None:
        recorded = self._recorded
        for call_id, result in zip(message.call_ids, message.results, strict=True):
            records = recorded.pop(call_id, None)
            if records is not None:
                records.succeeded(call_id, result)

    def _forget_recordings(self, records: RunRecords) -> None:
        """The run ended: its calls still open are recorded no more."""
        for root_id in records.open:
            self._recorded.pop(root_id, None)
        records.open.clear()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, defaultdict(list)
        loading, self._loading = self._loading, defaultdict(set)
        commands: list[DispatchCommand] = []
        for executor_id, messages in outbox.items():
            if not messages:
                continue
            frame, unsendable = self._encoder.encode_sendable(messages)
            loads = loading.get(executor_id, set())
            if unsendable:
                commands += self._unsendable(executor_id, unsendable)
                loads -= {u.message.digest for u in unsendable if type(u.message) is wire.LoadCode}
            # A module is loaded there once the frame with its LoadCode is written.
            if frame and self._pool.send(executor_id, frame) and loads:
                self._loaded.get(executor_id, set()).update(loads)
        if commands:
            self._apply(commands)

    def _unsendable(
        self, executor_id: str, unsendable: list[wire.Unsendable]
    ) -> list[DispatchCommand]:
        """Messages left out of a frame: each call among them fails alone (only calls'
        arguments can be what cannot be encoded; text is escaped, the rest is ours)."""
        now_ms = self._clock.now_ms()
        kind = CallFailureKind.BAD_ARGUMENTS
        commands: list[DispatchCommand] = []
        for message, reason in unsendable:
            if not isinstance(message, wire.ExecuteCalls):
                log.error("cannot send to executor %s: %r: %s", executor_id, message, reason)
                continue
            text = f"the call's arguments cannot be sent to an executor: {reason}"
            for call_id in message.call_ids:
                if self._spans.live:
                    self._spans.failed(call_id, kind.value, text)
                commands += self._core.call_unsent(executor_id, call_id, kind, text, now_ms)
        return commands

    def _arm_timer(self) -> None:
        if self._loop is not None:  # before start() nothing runs that could be due
            self._timer.arm(self._core.next_deadline_ms())

    def _on_timer(self) -> None:
        # Read every executor's CPU first: the core decides budgets and signs of life
        # from what the kernel says, whatever the executors' heartbeats do.
        now_ms = self._clock.now_ms()
        core = self._core
        commands: list[DispatchCommand] = []
        for executor_id, gauge in list(self._gauges.items()):
            commands += self._sample(executor_id, gauge, now_ms, memory=False)
        self._apply(commands + core.tick(now_ms))

    def _sample(
        self, executor_id: str, gauge: ExecutorGauge, now_ms: int, *, memory: bool
    ) -> list[DispatchCommand]:
        """Tell the core what the kernel says the executor used (its memory too)."""
        cpu = gauge.cpu()
        return self._core.executor_sample(
            executor_id,
            now_ms,
            cpu_ns=None if cpu is None else cpu.used_ns,
            waited_ns=None if cpu is None else cpu.waited_ns,
            rss_bytes=gauge.rss_bytes() if memory else None,
        )


def _io_failure(outcome: IoOutcome) -> Failure | None:
    """The failure an IO answer is, for the core (None: a value)."""
    return outcome.failure if isinstance(outcome, IoFailed) else None
