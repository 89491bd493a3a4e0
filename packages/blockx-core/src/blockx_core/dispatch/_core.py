"""DispatcherCore: the sans-IO engine of the Calls phase.

It owns, per task, a TaskCalls record (root calls, a window that doubles from
``initial_window`` up to ``task_max_inflight_calls``, outputs in root order), the
calls in flight and which executor holds each, bounded attempt retries, sub-calls
bound to their parents, and the executors' liveness. Its inputs are events (calls
completed, failed, suspended or resumed, an IO answer, a call waiting on a sub-call
or on one of a function that cannot be resolved, a task's function missing,
executor up / heartbeat / sampled / lost, ``tick``); its outputs are commands
(``SendCalls``, ``CancelCalls``, ``ResumeWithResult``, ``ResumeWithIo``,
``AbortCall``, ``KillExecutor``, ``RetireExecutor``, and ``CallsConverged`` or
``CallsFailed`` once per task). It never reads a clock: every event takes
``now_ms``; ``next_deadline_ms`` tells the adapter when to call ``tick``.

Root calls come incrementally: ``open_task`` starts a task's Calls phase,
``add_roots`` gives it more root calls (any number of times), and ``roots_done``
says the source has no more; the task converges once the source is done and every
root call finished. ``start_task`` does all three at once for a list known up
front. A root call is a ``RootCall`` (positional and keyword arguments, a
context) or, as a shorthand, the list of its positional arguments.

Rules:

* fastFail: a root call that fails terminally stops the task: its other calls are
  cancelled, outputs are discarded, and it converges CALL_FAILED.
* Outputs (JSON texts of the root calls' results, each tagged with its root index
  and context) are collected in root order; more than
  ``max_collected_output_bytes`` in total converges OUTPUT_BYTES_EXCEEDED.
* A sub-call is a new call bound to its parent (and inherits its context); its
  result resumes the parent and never appears in the outputs. Sub-calls bypass the
  task window, so a window full of waiting parents cannot deadlock.
* A failed attempt is retried (with back-off) when its kind is in the retry policy,
  attempts remain and the attempt did not say a retry cannot succeed; a result
  from an attempt the core no longer expects (its executor was declared lost, the
  task ended) is ignored, so no call is reported twice.
* An executor whose running call is over its CPU + IO budget is killed and the
  call fails BUDGET_EXCEEDED; one that shows no sign of life (no heartbeat, and
  its call thread's CPU clock does not move) for ``executor_heartbeat_timeout_ms``
  is killed too, the call it held charged EXECUTOR_LOST. The other calls on an
  executor that ended are sent again without an attempt counted. What a call uses
  is measured by the Worker, not reported by the executor (``Watchdog``,
  ``_watchdog.py``): a call over ``call_wall_limit_ms`` of holding its executor
  fails BUDGET_EXCEEDED and is cancelled, and a cancelled call still holding its
  executor ``cancel_grace_ms`` later gets it killed.
* An executor that ran ``executor_max_calls`` calls, or whose resident memory is
  over ``executor_max_rss_bytes`` between calls, is retired: it gets no new calls,
  and once it holds none the core asks for it to be replaced (``RetireExecutor``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from blockx_core.calls import RootCall, RootOutputs
from blockx_core.dispatch._book import CallBook
from blockx_core.dispatch._budget import Accounting
from blockx_core.dispatch._commands import (
    AbortCall,
    CancelCalls,
    DispatchCommand,
    ResumeWithIo,
    ResumeWithResult,
    SubCallFailed,
    SubCallReturned,
)
from blockx_core.dispatch._config import DispatchConfig
from blockx_core.dispatch._state import (
    Call,
    CallMove,
    CallState,
    CallUsage,
    Executor,
    TaskCalls,
    hold,
)
from blockx_core.dispatch._views import CallsWaiting, ExecutorState, calls_waiting, executor_state
from blockx_core.dispatch._watchdog import Watchdog
from blockx_core.errors import BlockxUsageError
from blockx_core.failures import CallFailureKind, Failure, IoErrorKind

# A function that returns None, as most table functions do for most rows: one
# shared object for every such output instead of one per call.
_NULL = b"null"


def _count_done(task: TaskCalls, done: int, nbytes: int) -> None:
    """``done`` root calls of ``task`` ended with ``nbytes`` of outputs."""
    task.output_bytes += nbytes
    task.done_roots += done
    task.inflight_roots -= done
    task.grown += done


class DispatcherCore:
    """See the module docstring. This class is the events: the state and the moves
    they share are in its ``CallBook`` (``_book.py``), what holds each executor and
    what it costs in its ``Watchdog`` (``_watchdog.py``). Every move appends the
    commands it implies to one outbox, which each event drains and returns."""

    def __init__(self, config: DispatchConfig | None = None) -> None:
        self._config = config or DispatchConfig()
        self._config.validate()
        self._outbox: list[DispatchCommand] = []
        self._book = CallBook(self._config, self._outbox)
        self._watchdog = Watchdog(self._book)

    def _drain(self) -> list[DispatchCommand]:
        """The commands the event just handled implies, in order; the outbox is empty
        again for the next one."""
        out = self._outbox[:]
        self._outbox.clear()
        return out

    # ---- inspection ------------------------------------------------------------------

    @property
    def config(self) -> DispatchConfig:
        return self._config

    def executor_ids(self) -> list[str]:
        return list(self._book.executors)

    def executor_load(self, executor_id: str) -> int:
        ex = self._book.executors.get(executor_id)
        return 0 if ex is None else len(ex.calls)

    def has_task(self, task_id: str) -> bool:
        return task_id in self._book.tasks

    def task_window(self, task_id: str) -> int:
        return self._book.tasks[task_id].window

    def task_inflight(self, task_id: str) -> int:
        """Root calls dispatched (or waiting for a retry) and not yet done."""
        return self._book.tasks[task_id].inflight_roots

    def task_pending(self, task_id: str) -> int:
        """Root calls added and not yet done, dispatched or not (0 for no such task)."""
        task = self._book.tasks.get(task_id)
        return 0 if task is None else task.added - task.done_roots

    def task_done(self, task_id: str) -> int:
        """Root calls done (0 for no such task)."""
        task = self._book.tasks.get(task_id)
        return 0 if task is None else task.done_roots

    def task_progress(self, task_id: str) -> tuple[int, int, bool, int] | None:
        """``(root calls done, root calls added, no more will be added, failed
        attempts)`` of an open task; None for no such task (converged or cancelled)."""
        task = self._book.tasks.get(task_id)
        if task is None:
            return None
        failed = len(task.failures) + task.failures_omitted
        return task.done_roots, task.added, task.source_done, failed

    def take_outputs(self, task_id: str) -> RootOutputs:
        """The outputs of the open task's root calls done in a row after the last
        taken (none for no such task); the task forgets them and converges with the
        rest only, and they no longer count towards MAX_COLLECTED_OUTPUT_BYTES. For
        a consumer that writes outputs as they come."""
        task = self._book.tasks.get(task_id)
        return RootOutputs([]) if task is None else task.take_done()

    def call_task(self, call_id: int) -> str | None:
        call = self._book.calls.get(call_id)
        return None if call is None else call.task.task_id

    def call_code(self, call_id: int) -> str | None:
        call = self._book.calls.get(call_id)
        return None if call is None else call.code

    def live_calls(self) -> int:
        return len(self._book.calls)

    def parent_call(self, call_id: int) -> int:
        """The call whose sub-call ``call_id`` is (0: a root call, or not live)."""
        call = self._book.calls.get(call_id)
        return 0 if call is None else call.parent

    def root_call(self, call_id: int) -> tuple[int, int, list[Any], dict[str, Any] | None] | None:
        """The root call whose attempt ``call_id`` is part of (itself for a root call,
        through its parents for a sub-call): its id, root index, positional and
        keyword arguments; None when the call or one of its parents is not live."""
        calls = self._book.calls
        call = calls.get(call_id)
        while call is not None and call.parent:
            call = calls.get(call.parent)
        if call is None:
            return None
        return call.call_id, call.root_index, call.args, call.kwargs

    def usage(self, task_id: str) -> CallUsage:
        """The task's measured cost; the same object fills up until the task ends."""
        return self._book.tasks[task_id].usage

    def holding_call(self, executor_id: str) -> int:
        """The call holding the executor now, as its messages tell (0: none); it may
        be one the core has let go that has not stopped yet."""
        ex = self._book.executors.get(executor_id)
        return ex.queue[0] if ex is not None and ex.queue else 0

    def executor_retiring(self, executor_id: str) -> bool:
        return executor_id in self._book.retiring

    def executor_states(self, now_ms: int) -> list[ExecutorState]:
        """Each executor up: the call it runs (for how long), its queue, its memory.
        O(calls held), for a page that asks now and then."""
        book = self._book
        return [executor_state(ex, book.calls, now_ms) for ex in book.executors.values()]

    def calls_waiting(self) -> CallsWaiting:
        """The calls not running, by what they wait for. O(executors + tasks + retries)."""
        book = self._book
        return calls_waiting(book.executors, book.calls, book.unassigned, book.retries, book.tasks)

    # ---- executors -------------------------------------------------------------------

    def executor_up(self, executor_id: str, now_ms: int) -> list[DispatchCommand]:
        book = self._book
        if executor_id in book.executors:
            raise BlockxUsageError(f"executor {executor_id!r} is already up")
        ex = book.executors[executor_id] = Executor(executor_id, now_ms)
        book.accepting[executor_id] = ex
        if book.unassigned:
            waiting, book.unassigned = book.unassigned, []
            # A sub-call's parent may have ended its attempt meanwhile.
            waiting = [c for c in waiting if c.call_id in book.calls]
            if waiting:
                book.send(waiting, now_ms=now_ms)
        return self._drain()

    def executor_heartbeat(
        self, executor_id: str, running_call: int, running_us: int, now_ms: int
    ) -> list[DispatchCommand]:
        ex = self._book.executors.get(executor_id)
        if ex is None:
            return []
        ex.alive_ms = now_ms
        ex.running_call = running_call
        ex.running_us = running_us
        if ex.accounting is Accounting.MEASURED:
            # The Worker measures this executor's CPU (``executor_sample``): the
            # figures it reports about itself only say which call it is on.
            self._watchdog.advance(ex, running_call, now_ms=now_ms)
        elif self._watchdog.check_budget(ex, now_ms=now_ms):
            self._book.send_restarts(now_ms=now_ms)
        return self._drain()

    def executor_sample(
        self,
        executor_id: str,
        now_ms: int,
        *,
        cpu_ns: int | None,
        waited_ns: int | None = None,
        rss_bytes: int | None = None,
    ) -> list[DispatchCommand]:
        """The executor's call thread has used ``cpu_ns`` of CPU in all (None: could
        not be read), has waited ``waited_ns`` for a CPU in all (None: not known), and
        its resident memory is ``rss_bytes``, as the kernel says. A clock that moved
        since the last sample is a sign of life."""
        book, watchdog = self._book, self._watchdog
        ex = book.executors.get(executor_id)
        if ex is None:
            return []
        if cpu_ns is not None:
            watchdog.sampled(ex, cpu_ns=cpu_ns, waited_ns=waited_ns, now_ms=now_ms)
            if watchdog.check_budget(ex, now_ms=now_ms):
                book.send_restarts(now_ms=now_ms)
                return self._drain()
        if rss_bytes is not None:
            ex.rss_bytes = rss_bytes
        watchdog.check_rss(ex)
        book.stop_retired()
        return self._drain()

    def executor_lost(self, executor_id: str, reason: str, now_ms: int) -> list[DispatchCommand]:
        """The executor's process or connection is gone (no kill needed)."""
        book = self._book
        ex = book.executors.pop(executor_id, None)
        book.accepting.pop(executor_id, None)
        book.retiring.pop(executor_id, None)
        if ex is not None:
            book.reschedule_lost(ex, reason=f"executor {executor_id} lost: {reason}", now_ms=now_ms)
            book.send_restarts(now_ms=now_ms)
        return self._drain()

    # ---- tasks -------------------------------------------------------------------------

    def open_task(
        self,
        task_id: str,
        code: str,
        function: str,
        now_ms: int,
        *,
        budget_ms: int | None = None,
    ) -> list[DispatchCommand]:
        """Start a Calls phase with no root calls yet: every root call will be of
        ``function`` in ``code`` (an opaque reference the adapter resolves).
        ``budget_ms`` is the per-call budget of this task (default:
        ``call_deadline_ms``). Follow with ``add_roots`` and ``roots_done``."""
        tasks = self._book.tasks
        if task_id in tasks:
            raise BlockxUsageError(f"task {task_id!r} already has a Calls phase")
        if budget_ms is not None and budget_ms < 1:
            raise BlockxUsageError(f"budget_ms must be >= 1 (got {budget_ms})")
        window = min(self._config.initial_window, self._config.task_max_inflight_calls)
        tasks[task_id] = TaskCalls(
            task_id, code, function, window, budget_ms or self._config.call_deadline_ms
        )
        return self._drain()

    def function_missing(self, task_id: str, message: str, now_ms: int) -> list[DispatchCommand]:
        """The adapter cannot resolve the open task's function (``message`` says why,
        for people): its first root call fails the task FUNCTION_NOT_FOUND (CALL_FAILED),
        and a task that gets none converges with no outputs, as any other."""
        task = self._book.tasks.get(task_id)
        if task is not None:
            task.missing = message
        return self._drain()

    def add_roots(
        self, task_id: str, roots: Sequence[RootCall | list[Any]], now_ms: int
    ) -> list[DispatchCommand]:
        """More root calls for an open task; they get the next root indexes. A task
        that has already failed (fastFail, output cap) or was cancelled ignores them."""
        task = self._book.tasks.get(task_id)
        if task is None:
            return []
        if task.source_done:
            raise BlockxUsageError(f"task {task_id!r}: root calls added after roots_done")
        if roots and task.missing is not None:
            self._book.function_missing(task, message=task.missing, now_ms=now_ms)
        elif roots:
            task.add(list(roots))
            self._book.fill(task, now_ms=now_ms)
        return self._drain()

    def roots_done(self, task_id: str, now_ms: int) -> list[DispatchCommand]:
        """The task's source has no more root calls: it converges once they finish."""
        task = self._book.tasks.get(task_id)
        if task is None or task.source_done:
            return []
        task.source_done = True
        self._book.after_progress(task, now_ms=now_ms)
        return self._drain()

    def start_task(
        self,
        task_id: str,
        code: str,
        function: str,
        calls: Sequence[RootCall | list[Any]],
        now_ms: int,
        *,
        budget_ms: int | None = None,
    ) -> list[DispatchCommand]:
        """``open_task``, ``add_roots(calls)`` and ``roots_done`` in one go."""
        out = self.open_task(task_id, code, function, now_ms, budget_ms=budget_ms)
        out += self.add_roots(task_id, calls, now_ms)
        out += self.roots_done(task_id, now_ms)
        return out

    def cancel_task(self, task_id: str, now_ms: int) -> list[DispatchCommand]:
        """Stop a task's calls (timeout, shutdown): CancelCalls, no convergence."""
        book = self._book
        task = book.tasks.pop(task_id, None)
        if task is not None:
            book.drop_calls(task, now_ms=now_ms)
            book.stop_retired()
        return self._drain()

    # ---- results -----------------------------------------------------------------------

    def calls_completed(
        self,
        executor_id: str,
        call_ids: Sequence[int],
        results: Sequence[bytes],
        now_ms: int,
    ) -> list[DispatchCommand]:
        book = self._book
        ex = book.executors.get(executor_id)
        if ex is None:
            return []  # a lost executor's late results: its calls were rescheduled
        calls = book.calls
        ex_calls = ex.calls
        touched: dict[str, TaskCalls] = {}
        # The calls ended in this order on the executor: the last one still queued
        # ends the hold of every entry up to it (they share the segment's CPU).
        queued = ex.queued
        for call_id in reversed(call_ids):
            if call_id in queued:
                self._watchdog.release(ex, call_id, now_ms=now_ms)
                break
        # Once per call of every frame: the common case (root calls of one task)
        # counts locally and adds up per task when the task changes or at the end.
        task: TaskCalls | None = None
        done = nbytes = 0
        for call_id, result in zip(call_ids, results, strict=True):
            call = calls.get(call_id)
            if call is None or call.executor_id != executor_id:
                continue  # cancelled, or an attempt the core no longer expects
            del calls[call_id]
            ex_calls.discard(call_id)
            if call.task is not task:
                if task is not None:
                    _count_done(task, done, nbytes)
                task, done, nbytes = call.task, 0, 0
            task.live.discard(call_id)
            if call.children:
                book.cancel_children(call, now_ms=now_ms)  # nothing can await them any more
            if call.parent:
                book.resume_parent(call, result=SubCallReturned(value_json=result), now_ms=now_ms)
                continue
            task.outputs[call.root_index - task.taken] = _NULL if result == _NULL else result
            if not done:
                touched[task.task_id] = task
            nbytes += len(result)
            done += 1
        if task is not None:
            _count_done(task, done, nbytes)
        for task in touched.values():
            book.after_progress(task, now_ms=now_ms)
        self._watchdog.check_rss(ex)
        if book.retiring:
            book.stop_retired()
        return self._drain()

    def call_failed(
        self,
        executor_id: str,
        call_id: int,
        kind: CallFailureKind,
        message: str,
        now_ms: int,
        *,
        cancel_on_executor: bool = False,
        retryable: bool = True,
    ) -> list[DispatchCommand]:
        """An attempt failed. ``cancel_on_executor`` when the Worker (not the executor)
        failed it, e.g. a write attempt, so the executor drops the suspended call.
        ``retryable=False`` says a retry cannot succeed (an IO error that fails the
        same way every time): no retry whatever the policy, reported not retryable."""
        book = self._book
        ex = book.executors.get(executor_id)
        if ex is not None and not cancel_on_executor:
            self._watchdog.release(ex, call_id, now_ms=now_ms)
        call = book.calls.get(call_id)
        if call is None or call.executor_id != executor_id:
            if book.retiring:
                book.stop_retired()
            return self._drain()
        if cancel_on_executor:
            self._outbox.append(CancelCalls(executor_id=executor_id, call_ids=[call_id]))
        if ex is not None:
            ex.calls.discard(call_id)
        call.move(CallMove.LEAVE)
        book.attempt_failed(call, kind=kind, message=message, now_ms=now_ms, retryable=retryable)
        if book.retiring:
            book.stop_retired()
        return self._drain()

    def call_unsent(
        self, executor_id: str, call_id: int, kind: CallFailureKind, message: str, now_ms: int
    ) -> list[DispatchCommand]:
        """The Worker could not send the call to ``executor_id`` (its arguments
        cannot be encoded): the attempt fails and a retry cannot succeed."""
        book = self._book
        ex = book.executors.get(executor_id)
        call = book.calls.get(call_id)
        if ex is not None:
            self._watchdog.unhold(ex, call_id, now_ms=now_ms)
            ex.calls.discard(call_id)
        if call is not None and call.executor_id == executor_id:
            call.move(CallMove.LEAVE)
            book.attempt_failed(call, kind=kind, message=message, now_ms=now_ms, retryable=False)
        if book.retiring:
            book.stop_retired()
        return self._drain()

    # ---- suspension (the Worker answers reads itself) ---------------------------------

    def call_suspended(self, executor_id: str, call_id: int, now_ms: int) -> None:
        """A call suspended (IoRequested or SubCallRequested): it no longer holds the
        executor."""
        ex = self._book.executors.get(executor_id)
        if ex is not None:
            self._watchdog.release(ex, call_id, now_ms=now_ms)

    def call_resuming(self, executor_id: str, call_id: int, io_us: int, now_ms: int) -> bool:
        """The Worker is about to send the call's ResumeCall (an IO answer, ``io_us`` of
        backend time charged to it, or a sub-call it could not start); False when the
        call is no longer wanted (send nothing). ``io_answered`` and
        ``subcall_unresolved`` use it and say what to send; an adapter needs it only
        for a ResumeCall of its own."""
        book = self._book
        ex = book.executors.get(executor_id)
        call = book.calls.get(call_id)
        if ex is None or call is None or call.executor_id != executor_id:
            return False
        call.io_us += io_us
        call.task.usage.io_us += io_us
        hold(ex, call_id, now_ms=now_ms, parent=call.parent)
        return True

    def io_answered(
        self,
        executor_id: str,
        call_id: int,
        now_ms: int,
        *,
        io_us: int,
        failure: Failure | None = None,
    ) -> list[DispatchCommand]:
        """The Worker has the answer to the call's IO request: a value, or ``failure``
        (an ``IoErrorKind``), after ``io_us`` of backend time charged to the call.

        A write fails the call WRITE_FORBIDDEN (writes go through a Writer Plugin,
        and a function that catches the refusal must not go on as if it wrote):
        ``AbortCall``, the attempt failed as any other. Any other answer resumes the
        call (``ResumeWithIo``; the function sees a failure as an ``IoError``),
        unless the call is no longer wanted (nothing)."""
        if failure is not None and failure.kind is IoErrorKind.WRITE_FORBIDDEN:
            return self._worker_failed(
                executor_id,
                call_id,
                kind=CallFailureKind.WRITE_FORBIDDEN,
                message=failure.message,
                now_ms=now_ms,
            )
        if not self.call_resuming(executor_id, call_id, io_us, now_ms):
            return []
        return [ResumeWithIo(executor_id=executor_id, call_id=call_id)]

    def _worker_failed(
        self, executor_id: str, call_id: int, *, kind: CallFailureKind, message: str, now_ms: int
    ) -> list[DispatchCommand]:
        """The Worker failed a suspended call's attempt itself: the executor drops
        the call, and the attempt fails as any other (retried if the policy says so)."""
        book = self._book
        call = book.calls.get(call_id)
        if call is None or call.executor_id != executor_id:
            if book.retiring:
                book.stop_retired()
            return self._drain()
        failure = Failure.of(kind, message)
        self._outbox.append(AbortCall(executor_id=executor_id, call_id=call_id, failure=failure))
        ex = book.executors.get(executor_id)
        if ex is not None:
            ex.calls.discard(call_id)
        call.move(CallMove.LEAVE)
        book.attempt_failed(call, kind=kind, message=message, now_ms=now_ms)
        if book.retiring:
            book.stop_retired()
        return self._drain()

    def subcall_unresolved(
        self, executor_id: str, parent_call_id: int, message: str, now_ms: int
    ) -> list[DispatchCommand]:
        """The parent awaits a sub-call of a function the adapter cannot resolve
        (``message`` says why, for people): the parent resumes at once with a
        FUNCTION_NOT_FOUND failure it may handle; no sub-call is made."""
        if not self.call_resuming(executor_id, parent_call_id, 0, now_ms):
            return []
        failure = Failure.of(CallFailureKind.FUNCTION_NOT_FOUND, message)
        return [
            ResumeWithResult(
                executor_id=executor_id,
                call_id=parent_call_id,
                result=SubCallFailed(failure=failure),
            )
        ]

    def subcall_requested(
        self,
        executor_id: str,
        parent_call_id: int,
        code: str,
        function: str,
        args: list[Any],
        now_ms: int,
        *,
        kwargs: dict[str, Any] | None = None,
    ) -> list[DispatchCommand]:
        """The parent awaits ``call(function, *args, **kwargs)``: schedule the child,
        with the parent's context. (The adapter reports the suspension itself with
        ``call_suspended``.)"""
        book = self._book
        parent = book.calls.get(parent_call_id)
        if parent is None or parent.executor_id != executor_id:
            return []
        child = book.new_call(
            parent.task,
            root_index=-1,
            parent=parent_call_id,
            code=code,
            function=function,
            args=args,
            kwargs=kwargs or None,
            context=parent.context,
        )
        if child.kwargs is not None:
            parent.task.extras = True
        if parent.children is None:
            parent.children = []
        parent.children.append(child.call_id)
        book.send([child], now_ms=now_ms)
        return self._drain()

    # ---- time ---------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[DispatchCommand]:
        """Time passed. The adapter samples each executor's CPU (``executor_sample``)
        just before, so an executor whose heartbeats a call starves (one holding the
        GIL) is seen working."""
        book, watchdog = self._book, self._watchdog
        timeout = self._config.executor_heartbeat_timeout_ms
        quiet = [e for e in book.executors.values() if now_ms - e.alive_ms > timeout]
        for ex in quiet:  # none of them is sent a call again in this tick
            book.accepting.pop(ex.executor_id, None)
        watchdog.check_holds(now_ms=now_ms)
        for ex in quiet:
            if ex.executor_id not in book.executors or watchdog.check_budget(ex, now_ms=now_ms):
                continue
            measured = ex.accounting is Accounting.MEASURED
            silent = "no heartbeat and no CPU progress" if measured else "no heartbeat"
            book.kill(ex, reason=f"{silent} for {now_ms - ex.alive_ms} ms", now_ms=now_ms)
        book.send_restarts(now_ms=now_ms)
        ready: list[Call] = []
        retries = book.retries
        while retries and retries[0][0] <= now_ms:
            _, call_id = heapq.heappop(retries)
            call = book.calls.get(call_id)
            if call is not None and call.state is CallState.BACKING_OFF:
                call.move(CallMove.RETRY)
                ready.append(call)
        if ready:
            book.send(ready, now_ms=now_ms)
        if book.retiring:
            book.stop_retired()
        return self._drain()

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work: a retry falls due, an executor's sign of life
        is overdue, a call reaches its wall limit or a cancelled one its grace, or a
        running call could have reached its budget (sample its CPU then)."""
        book, watchdog = self._book, self._watchdog
        deadlines = []
        timeout = self._config.executor_heartbeat_timeout_ms + 1
        for ex in book.executors.values():
            deadlines.append(ex.alive_ms + timeout)
            if ex.queue:
                held = watchdog.hold_deadline(ex)
                if held is not None:
                    deadlines.append(held)
                budget = watchdog.budget_deadline(ex)
                if budget is not None:
                    deadlines.append(budget)
        if book.retries:
            deadlines.append(book.retries[0][0])
        return min(deadlines) if deadlines else None
