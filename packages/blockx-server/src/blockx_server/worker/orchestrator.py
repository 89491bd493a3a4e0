"""The Orchestrator: the Worker's adapter around WorkerCore.

It performs what the core decides: activation (pin the code epoch, open the task's
IO scope), the three phases under their admission semaphores (their work is in
``phase_work.py``), stopping a task's work (``AbortTaskWork``: its calls get
CancelCall), cleanup at convergence (close the IO scope, unpin the epoch),
OnTaskTerminal → Watch subscribers, and the call progress the core publishes → the
subscribers that asked for it (``call_progress.py`` counts the calls). A task's
activation and its phases run in turn in one asyncio task (its job), so the next
phase starts the moment the core says so; each phase reports back with
``handle_task_phase_finished`` and the token of the command that started it; a
builder or writer name it has no plug-in for is reported with
``handle_plugin_not_found``. The core alone decides what comes next, and refuses an
answer that comes too late (its token is stale), so a stopped phase needs no guard
here.

Timers: after every batch of commands the orchestrator asks the core for its next
deadline and arms one ``loop.call_later`` (see ``_arm_timer``); there is no polling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, assert_never

from blockx_core.code_view import FunctionCodeView, NoSnapshotError
from blockx_core.error_rate import ErrorRateWindow
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.failures import Failure, FailureCode
from blockx_core.ids import shown
from blockx_core.task import TaskInput, TaskState
from blockx_core.worker import (
    AbortTaskWork,
    CallProgress,
    CancelAnswer,
    ListTasksQuery,
    PhaseCrashed,
    PhaseFailed,
    PhaseOutcome,
    PhaseStart,
    PrepareTaskActivation,
    PublishProgress,
    SlotExpired,
    StartBuilderPhase,
    StartCallPhase,
    StartWriterPhase,
    TaskConverged,
    TaskListing,
    TaskPhase,
    TaskSnapshot,
    WatchStream,
    WorkerCommand,
    WorkerCore,
    is_worker_fault,
)
from blockx_server.calls.engine import CallEngine
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import Builders, StreamBuildConfig
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.task_chain import ChainRefused, task_chain
from blockx_server.pipeline.writers import Writers
from blockx_server.runtime.clock import Clock
from blockx_server.runtime.timer import DeadlineTimer
from blockx_server.worker import subscriptions as watch
from blockx_server.worker.call_progress import ProgressCounter
from blockx_server.worker.call_records import CallRecordStore
from blockx_server.worker.metrics import FunctionCalls
from blockx_server.worker.offload import Offload
from blockx_server.worker.phase_work import AdmissionConfig, PhaseWork
from blockx_server.worker.subscriptions import Subscription, SubscriptionManager
from blockx_server.worker.task_log import TaskLog
from blockx_server.worker.task_runtime import TaskRuntime

log = logging.getLogger(__name__)

# The longest the timer sleeps while a deadline is pending: the spec's 500 ms scan
# period, kept as an upper bound on lateness. The core's time is the Clock's
# wall-clock milliseconds, the loop's timer is monotonic; when the two disagree (the
# wall clock steps, a test clock is moved by hand) a deadline still fires at most
# this late. With no deadline pending nothing is armed.
MAX_TIMER_SLEEP_MS: Final = 500


class Orchestrator:
    def __init__(
        self,
        core: WorkerCore,
        engine: CallEngine,
        code_view: FunctionCodeView,
        io: IoRouter,
        builders: Builders,
        writers: Writers,
        subscriptions: SubscriptionManager,
        clock: Clock,
        admission: AdmissionConfig | None = None,
        error_rate: ErrorRateWindow | None = None,
        on_terminal: Callable[[TaskConverged, float | None], None] | None = None,
        on_code_released: Callable[[], None] | None = None,
        stream_build: StreamBuildConfig | None = None,
        offload: Offload | None = None,
        task_log: TaskLog | None = None,
        function_calls: Callable[[str], FunctionCalls] | None = None,
        call_records: CallRecordStore | None = None,
    ) -> None:
        admission = admission or AdmissionConfig()
        # Parses and builds of large configs run on its threads, not on the loop.
        self.offload = offload or Offload()
        self.stream_build = stream_build or StreamBuildConfig()
        self.core = core
        self.engine = engine
        self.code_view = code_view
        self.io = io
        self.builders = builders
        self.writers = writers
        self.subscriptions = subscriptions
        self.clock = clock
        self.error_rate = error_rate or ErrorRateWindow()
        self._runtimes: dict[str, TaskRuntime] = {}
        self._converged = asyncio.Event()
        # Told of every terminal task, with seconds since it was accepted (metrics).
        self._on_terminal = on_terminal
        # Told when a task unpinned its code epoch (the view's collection may be due).
        self._on_code_released = on_code_released
        self._timer = DeadlineTimer(clock, self.tick)  # tick runs the commands, then re-arms
        self.task_log = task_log or TaskLog("")
        self._work = PhaseWork(
            engine,
            admission,
            self.offload,
            self.stream_build,
            self.task_log,
            ProgressCounter(engine, self._calls_counted),
            self._writer_started,
            function_calls,
            call_records,
            clock,
        )
        # The records of the calls that failed tasks (GetCallRecord); None: not kept.
        self.call_records = call_records
        self.max_calls = self._work.max_calls

    # ---- the RPCs' entry points ---------------------------------------------------

    def request_task_slot(self, task_id: str, ttl_ms: int) -> TaskSnapshot | Refusal:
        answer = self.core.handle_request_task_slot(task_id, ttl_ms, self.clock.now_ms())
        self._arm_timer()  # a new lease
        if isinstance(answer, TaskSnapshot):
            self.task_log.reserved(answer)
        return answer

    def submit_task(self, task: TaskInput, slot_id: str) -> TaskSnapshot | Refusal:
        answer = self.core.handle_submit_task(task, slot_id, self.clock.now_ms())
        if isinstance(answer, Refusal):
            return answer
        snapshot, commands = answer
        self._run(commands)
        return snapshot

    def input_differs(self, task: TaskInput) -> bool:
        return self.core.input_differs(task, self.clock.now_ms())

    def get_task_result(self, task_id: str) -> TaskSnapshot | Refusal:
        return self.core.handle_get_task_result(task_id, self.clock.now_ms())

    def get_call_record(self, task_id: str, call_index: int | None) -> tuple[int, bytes] | Refusal:
        """GetCallRecord: the record of a failed call of a retained failed task, with
        its root index; NOT_FOUND saying why there is none."""
        if call_index is not None and call_index < 0:
            return Refusal(
                ErrorCode.INVALID_ARGUMENT, f"call_index must be >= 0 (got {call_index})"
            )
        answer = self.get_task_result(task_id)
        if isinstance(answer, Refusal):
            if answer.code is ErrorCode.NOT_FOUND and self.call_records is not None:
                self.call_records.forget(task_id)
            return answer
        shown_id = shown(task_id)
        if answer.state is TaskState.SUCCEEDED:
            return Refusal(
                ErrorCode.NOT_FOUND,
                f"task {shown_id} succeeded: only the calls that fail a task are recorded",
            )
        if not answer.state.is_terminal:
            return Refusal(
                ErrorCode.NOT_FOUND,
                f"task {shown_id} is {answer.state.value}: a call's record is kept once "
                "the call fails the task",
            )
        if self.call_records is None:
            return Refusal(ErrorCode.NOT_FOUND, "this Worker keeps no call records")
        found = self.call_records.get(task_id, call_index, self.clock.now_ms())
        return Refusal(ErrorCode.NOT_FOUND, found) if isinstance(found, str) else found

    def cancel_task(self, task_id: str) -> CancelAnswer | Refusal:
        """CancelTask: the core decides; a task it converges has its work stopped
        (AbortTaskWork) and its watchers told at once."""
        answer = self.core.handle_cancel_task(task_id, self.clock.now_ms())
        if isinstance(answer, Refusal):
            return answer
        cancel, commands = answer
        self.task_log.cancel_asked(task_id, cancel.outcome)
        self._run(commands)
        return cancel

    def _writer_started(self, task_id: str) -> None:
        runtime = self._runtimes.get(task_id)
        if runtime is not None:
            now_ms = self.clock.now_ms()
            self._run(self.core.handle_writer_started(task_id, runtime.token, now_ms))

    def open_watch(
        self, task_ids: Sequence[str], *, progress: bool = False
    ) -> tuple[WatchStream, Subscription] | Refusal:
        """WatchTasks: the core checks the request and answers the first snapshots;
        the stream subscribes to the tasks' updates at once, so that none falls in
        between. ``progress``: it asked for call progress."""
        opened = self.core.handle_open_watch(task_ids, self.clock.now_ms(), progress=progress)
        if isinstance(opened, Refusal):
            return opened
        self._arm_timer()  # a watch grace may have stopped
        return opened, self.subscriptions.subscribe(opened.task_ids, progress=progress)

    def close_watch(self, stream: WatchStream, subscription: Subscription) -> None:
        """The Watch stream is gone; the tasks it still waited for may start their
        watch grace."""
        self.subscriptions.unsubscribe(subscription)
        self.core.handle_close_watch(stream, self.clock.now_ms())
        self._arm_timer()

    def list_tasks(self, query: ListTasksQuery) -> TaskListing | Refusal:
        return self.core.handle_list_tasks(query, self.clock.now_ms())

    def _calls_counted(self, task_id: str, progress: CallProgress) -> None:
        self._run(self.core.handle_calls_progress(task_id, progress, self.clock.now_ms()))

    def tick(self) -> None:
        self._run(self.core.tick_timers(self.clock.now_ms()))

    def running_tasks(self) -> int:
        return len(self._runtimes)

    def refuse_new_work(self) -> None:
        """From now on RequestTaskSlot and SubmitTask answer UNAVAILABLE."""
        self.core.start_draining()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new work, let running tasks converge for up to ``timeout_s``, then
        cancel the rest (they converge CANCELLED, retryable)."""
        self.refuse_new_work()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # The core's timers keep running meanwhile (timeouts, lost watches).
        while self.core.active_task_ids() and loop.time() < deadline:
            self._converged.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._converged.wait()
            except TimeoutError:
                break
        for task_id in self.core.active_task_ids():
            runtime = self._runtimes.get(task_id)
            if runtime is not None and runtime.job is not None:
                runtime.job.cancel()
        # Let the cancelled phases report CANCELLED.
        for _ in range(100):
            if not self.core.active_task_ids():
                break
            await asyncio.sleep(0.01)
        self._timer.cancel()  # the process is about to exit; nothing more to rule on

    # ---- commands ------------------------------------------------------------------

    def _run(self, commands: list[WorkerCommand]) -> None:
        start = self._perform(commands)
        if start is not None:
            # The core starts a phase only in answer to its task's job, which runs it
            # itself (``_phases``); one started elsewhere gets a job of its own.
            runtime = self._runtimes[start.task_id]
            runtime.job = asyncio.create_task(self._phases(runtime, start))

    def _perform(self, commands: list[WorkerCommand]) -> PhaseStart | None:
        """Run the commands but a phase start, which is answered: the caller runs it."""
        start: PhaseStart | None = None
        for command in commands:
            match command:
                case PrepareTaskActivation():
                    new = TaskRuntime(command.task, command.deadline_ms)
                    self.task_log.submitted(command.task)
                    self._runtimes[command.task_id] = new
                    new.job = asyncio.create_task(self._job(new, command.token))
                case StartBuilderPhase() | StartCallPhase() | StartWriterPhase():
                    start = command
                case AbortTaskWork():
                    aborted = self._runtimes.get(command.task_id)
                    if aborted is not None and aborted.job is not None:
                        aborted.job.cancel()  # its calls get CancelCall
                case TaskConverged():
                    self._on_converged(command)
                case SlotExpired():
                    self.task_log.slot_expired(command.task_id, command.slot_id)
                    self.subscriptions.publish(
                        watch.SlotExpired(task_id=command.task_id, timestamp_ms=self.clock.now_ms())
                    )
                case PublishProgress():
                    self.subscriptions.publish_progress(
                        watch.Progress(
                            task_id=command.task_id,
                            progress=command.progress,
                            timestamp_ms=self.clock.now_ms(),
                        )
                    )
                case _:
                    assert_never(command)
        for purged in self.core.take_purged():
            self.task_log.purged(purged)
        self._arm_timer()
        return start

    def _arm_timer(self) -> None:
        """Arm the one timer for the core's next deadline (capped, see
        MAX_TIMER_SLEEP_MS). Asked after every batch of commands; an armed timer that
        is already early enough stays, one that fires early only re-arms."""
        deadline_ms = self.core.next_deadline_ms()
        if deadline_ms is None:
            return  # nothing pending; a later call arms again
        self._timer.arm(min(deadline_ms, self.clock.now_ms() + MAX_TIMER_SLEEP_MS))

    def _on_converged(self, command: TaskConverged) -> None:
        now_ms = self.clock.now_ms()
        runtime = self._runtimes.pop(command.task_id, None)
        if runtime is not None and runtime.ctx is not None:
            runtime.ctx.io.close()
        self.code_view.unpin(command.task_id, now_ms)
        if self._on_code_released is not None:
            self._on_code_released()
        result = command.result
        self.error_rate.record(not is_worker_fault(result), now_ms)
        self.subscriptions.publish(
            watch.Converged(
                task_id=command.task_id,
                state=command.state,
                result=command.result,
                timestamp_ms=now_ms,
                progress=command.progress,
            )
        )
        elapsed = None if runtime is None else time.perf_counter() - runtime.accepted
        self.task_log.converged(command, elapsed)
        if self._on_terminal is not None:
            self._on_terminal(command, elapsed)
        self._converged.set()

    # ---- activation and phases -----------------------------------------------------

    async def _job(self, runtime: TaskRuntime, token: int) -> None:
        """Activation, then each phase the core starts, in this one asyncio task: a
        phase that follows another starts at once, not a loop iteration later in a
        task of its own (a single-call task converges that much sooner)."""
        await self._phases(runtime, self._perform(self._activate(runtime, token)))

    async def _phases(self, runtime: TaskRuntime, start: PhaseStart | None) -> None:
        while start is not None:
            start = self._perform(await self._phase(runtime, start))

    def _activate(self, runtime: TaskRuntime, token: int) -> list[WorkerCommand]:
        """Pin the code epoch and open the task's IO scope; the core's answer to it."""
        task_id = runtime.task.task_id
        core = self.core
        now_ms = self.clock.now_ms()
        try:
            snapshot = self.code_view.pin(task_id, now_ms)
        except NoSnapshotError as exc:
            message = f"no function code: {exc}"
            return core.handle_task_activation_failed(
                task_id, token, FailureCode.ACTIVATION_FAILED, message, now_ms
            )
        served = [chain_io.chain for chain_io in self.io.chains()]
        try:
            chain = task_chain(runtime.task.function_call_config.config, served)
        except ChainRefused as exc:
            return core.handle_task_activation_failed(
                task_id, token, FailureCode.ACTIVATION_FAILED, str(exc), now_ms, retryable=False
            )
        try:
            scope = TaskIoScope(
                self.io,
                task_id,
                chain=None if chain is None else chain.name,
                code_epoch=snapshot.epoch,
            )
        except Exception as exc:
            message = f"cannot open the IO scope: {exc}"
            return core.handle_task_activation_failed(
                task_id, token, FailureCode.IO_SCOPE_FAILED, message, now_ms
            )
        runtime.ctx = TaskContext(
            task=runtime.task, deadline_ms=runtime.deadline_ms, code=snapshot, io=scope, chain=chain
        )
        self.task_log.activated(task_id, snapshot.epoch)
        return core.handle_task_activation_prepared(task_id, token, self.clock.now_ms())

    async def _phase(self, runtime: TaskRuntime, start: PhaseStart) -> list[WorkerCommand]:
        """Run the phase ``start`` names; the core's answer to its outcome."""
        task_id = start.task_id
        work = self._work
        body: Awaitable[PhaseOutcome]  # the phase's work, awaited below
        match start:
            case StartBuilderPhase():
                phase = TaskPhase.BUILDER
                name = runtime.task.function_call_config.type
                builder = self.builders.get(name)
                if builder is None:
                    message = self.builders.missing(name)
                    now_ms = self.clock.now_ms()
                    return self.core.handle_plugin_not_found(task_id, start.token, message, now_ms)
                body = work.builder(runtime, builder)
            case StartCallPhase():
                phase = TaskPhase.CALLS
                handler = runtime.task.result_handler
                body = work.calls(
                    runtime, None if handler is None else self.writers.get(handler.type)
                )
            case StartWriterPhase():
                phase = TaskPhase.WRITER
                handler = runtime.task.result_handler
                writer = None if handler is None else self.writers.get(handler.type)
                if handler is not None and writer is None:
                    message = self.writers.missing(handler.type)
                    now_ms = self.clock.now_ms()
                    return self.core.handle_plugin_not_found(task_id, start.token, message, now_ms)
                body = work.writer(runtime, writer)
            case _:
                assert_never(start)
        runtime.token = start.token
        self.task_log.phase_started(task_id, phase)
        started = time.perf_counter()
        outcome: PhaseOutcome
        try:
            outcome = await body
        except asyncio.CancelledError:
            # The Worker is shutting down (drain); a task the core stopped itself
            # (AbortTaskWork) is converged already, and the core refuses this answer.
            outcome = PhaseFailed(
                failure=Failure.of(
                    FailureCode.CANCELLED,
                    f"the task was cancelled during its {phase.value.lower()} phase "
                    "(the worker is shutting down)",
                )
            )
        except Exception as exc:
            log.exception("the %s phase of task %s crashed", phase.value, task_id)
            outcome = PhaseCrashed(message=f"internal error in the worker: {exc!r}")
        commands = self.core.handle_task_phase_finished(
            task_id, start.token, outcome, self.clock.now_ms()
        )
        if commands:  # accepted: a refused (stale) answer is not the phase's end
            self.task_log.phase_finished(task_id, phase, outcome, time.perf_counter() - started)
        return commands
