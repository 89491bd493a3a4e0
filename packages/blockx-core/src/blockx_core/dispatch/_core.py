"""DispatcherCore: the sans-IO engine of the Calls phase.

It owns, per task, a TaskCalls record (root calls, a window that doubles from
``initial_window`` up to ``task_max_inflight_calls``, outputs in root order), the
calls in flight and which executor holds each, bounded attempt retries, sub-calls
bound to their parents, and the executors' liveness. Its inputs are events (calls
completed, failed, suspended or resumed, a call waiting on a sub-call, executor up
/ heartbeat / sampled / lost, ``tick``); its outputs are commands (``SendCalls``,
``CancelCalls``, ``ResumeWithResult``, ``KillExecutor``, ``RetireExecutor``,
``ConvergeTaskCalls``). It never reads a
clock: every event takes ``now_ms``; ``next_deadline_ms`` tells the adapter when to
call ``tick``.

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

from blockx_core.calls import RootCall
from blockx_core.dispatch._commands import (
    CancelCalls,
    DispatchCommand,
)
from blockx_core.dispatch._config import DispatchConfig
from blockx_core.dispatch._state import Call, CallUsage, Executor, TaskCalls
from blockx_core.dispatch._views import CallsWaiting, ExecutorState, calls_waiting, executor_state
from blockx_core.dispatch._watchdog import Watchdog
from blockx_core.errors import BlockxUsageError
from blockx_core.failures import CallFailureKind

# A function that returns None, as most table functions do for most rows: one
# shared object for every such output instead of one per call.
_NULL = b"null"


class DispatcherCore(Watchdog):
    """See the module docstring. The state and the moves its events share are in
    ``CallBook`` (``_book.py``), what holds each executor in ``Watchdog``
    (``_watchdog.py``); this class is the events."""

    # ---- inspection ------------------------------------------------------------------

    @property
    def config(self) -> DispatchConfig:
        return self._config

    def executor_ids(self) -> list[str]:
        return list(self._executors)

    def executor_load(self, executor_id: str) -> int:
        ex = self._executors.get(executor_id)
        return 0 if ex is None else len(ex.calls)

    def has_task(self, task_id: str) -> bool:
        return task_id in self._tasks

    def task_window(self, task_id: str) -> int:
        return self._tasks[task_id].window

    def task_inflight(self, task_id: str) -> int:
        """Root calls dispatched (or waiting for a retry) and not yet done."""
        return self._tasks[task_id].inflight_roots

    def task_pending(self, task_id: str) -> int:
        """Root calls added and not yet done, dispatched or not (0 for no such task)."""
        task = self._tasks.get(task_id)
        return 0 if task is None else task.added - task.done_roots

    def task_progress(self, task_id: str) -> tuple[int, int, bool, int] | None:
        """``(root calls done, root calls added, no more will be added, failed
        attempts)`` of an open task; None for no such task (converged or cancelled)."""
        task = self._tasks.get(task_id)
        if task is None:
            return None
        failed = len(task.failures) + task.failures_omitted
        return task.done_roots, task.added, task.source_done, failed

    def call_task(self, call_id: int) -> str | None:
        call = self._calls.get(call_id)
        return None if call is None else call.task.task_id

    def call_code(self, call_id: int) -> str | None:
        call = self._calls.get(call_id)
        return None if call is None else call.code

    def live_calls(self) -> int:
        return len(self._calls)

    def parent_call(self, call_id: int) -> int:
        """The call whose sub-call ``call_id`` is (0: a root call, or not live)."""
        call = self._calls.get(call_id)
        return 0 if call is None else call.parent

    def usage(self, task_id: str) -> CallUsage:
        """The task's measured cost; the same object fills up until the task ends."""
        return self._tasks[task_id].usage

    def holding_call(self, executor_id: str) -> int:
        """The call holding the executor now, as its messages tell (0: none); it may
        be one the core has let go that has not stopped yet."""
        ex = self._executors.get(executor_id)
        return ex.queue[0] if ex is not None and ex.queue else 0

    def executor_retiring(self, executor_id: str) -> bool:
        return executor_id in self._retiring

    def executor_states(self, now_ms: int) -> list[ExecutorState]:
        """Each executor up: the call it runs (for how long), its queue, its memory.
        O(calls held), for a page that asks now and then."""
        return [executor_state(ex, self._calls, now_ms) for ex in self._executors.values()]

    def calls_waiting(self) -> CallsWaiting:
        """The calls not running, by what they wait for. O(executors + tasks + retries)."""
        return calls_waiting(
            self._executors, self._calls, self._unassigned, self._retries, self._tasks
        )

    # ---- executors -------------------------------------------------------------------

    def executor_up(self, executor_id: str, now_ms: int) -> list[DispatchCommand]:
        if executor_id in self._executors:
            raise BlockxUsageError(f"executor {executor_id!r} is already up")
        ex = self._executors[executor_id] = Executor(executor_id, now_ms)
        self._accepting[executor_id] = ex
        out: list[DispatchCommand] = []
        if self._unassigned:
            waiting, self._unassigned = self._unassigned, []
            # A sub-call's parent may have ended its attempt meanwhile.
            waiting = [c for c in waiting if c.call_id in self._calls]
            if waiting:
                self._send(waiting, out, now_ms)
        return out

    def executor_heartbeat(
        self, executor_id: str, running_call: int, running_us: int, now_ms: int
    ) -> list[DispatchCommand]:
        ex = self._executors.get(executor_id)
        if ex is None:
            return []
        ex.alive_ms = now_ms
        ex.running_call = running_call
        ex.running_us = running_us
        out: list[DispatchCommand] = []
        if ex.measured:
            # The Worker measures this executor's CPU (``executor_sample``): the
            # figures it reports about itself only say which call it is on.
            self._advance(ex, running_call, now_ms)
        elif self._check_budget(ex, now_ms, out):
            self._send_restarts(out, now_ms)
        return out

    def executor_lost(self, executor_id: str, reason: str, now_ms: int) -> list[DispatchCommand]:
        """The executor's process or connection is gone (no kill needed)."""
        ex = self._executors.pop(executor_id, None)
        self._accepting.pop(executor_id, None)
        self._retiring.pop(executor_id, None)
        out: list[DispatchCommand] = []
        if ex is not None:
            self._reschedule_lost(
                ex, None, 0, f"executor {executor_id} lost: {reason}", now_ms, out
            )
            self._send_restarts(out, now_ms)
        return out

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
        if task_id in self._tasks:
            raise BlockxUsageError(f"task {task_id!r} already has a Calls phase")
        if budget_ms is not None and budget_ms < 1:
            raise BlockxUsageError(f"budget_ms must be >= 1 (got {budget_ms})")
        window = min(self._config.initial_window, self._config.task_max_inflight_calls)
        self._tasks[task_id] = TaskCalls(
            task_id, code, function, window, budget_ms or self._config.call_deadline_ms
        )
        return []

    def add_roots(
        self, task_id: str, roots: Sequence[RootCall | list[Any]], now_ms: int
    ) -> list[DispatchCommand]:
        """More root calls for an open task; they get the next root indexes. A task
        that has already failed (fastFail, output cap) or was cancelled ignores them."""
        task = self._tasks.get(task_id)
        if task is None:
            return []
        if task.source_done:
            raise BlockxUsageError(f"task {task_id!r}: root calls added after roots_done")
        out: list[DispatchCommand] = []
        if roots:
            task.add(list(roots))
            self._fill(task, out, now_ms)
        return out

    def roots_done(self, task_id: str, now_ms: int) -> list[DispatchCommand]:
        """The task's source has no more root calls: it converges once they finish."""
        task = self._tasks.get(task_id)
        if task is None or task.source_done:
            return []
        task.source_done = True
        out: list[DispatchCommand] = []
        self._after_progress(task, out, now_ms)
        return out

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
        task = self._tasks.pop(task_id, None)
        out: list[DispatchCommand] = []
        if task is not None:
            self._drop_calls(task, out, now_ms)
            self._stop_retired(out)
        return out

    # ---- results -----------------------------------------------------------------------

    def calls_completed(
        self,
        executor_id: str,
        call_ids: Sequence[int],
        results: Sequence[bytes],
        now_ms: int,
    ) -> list[DispatchCommand]:
        ex = self._executors.get(executor_id)
        if ex is None:
            return []  # a lost executor's late results: its calls were rescheduled
        calls = self._calls
        ex_calls = ex.calls
        out: list[DispatchCommand] = []
        touched: dict[str, TaskCalls] = {}
        # The calls ended in this order on the executor: the last one still queued
        # ends the hold of every entry up to it (they share the segment's CPU).
        queued = ex.queued
        for call_id in reversed(call_ids):
            if call_id in queued:
                self._release(ex, call_id, now_ms)
                break
        for call_id, result in zip(call_ids, results, strict=True):
            call = calls.get(call_id)
            if call is None or call.executor_id != executor_id:
                continue  # cancelled, or an attempt the core no longer expects
            del calls[call_id]
            ex_calls.discard(call_id)
            task = call.task
            task.live.discard(call_id)
            if call.children:
                self._cancel_children(call, out, now_ms)  # nothing can await them any more
            if call.parent:
                self._resume_parent(call, True, result, "", "", out, now_ms)
                continue
            task.outputs[call.root_index] = _NULL if result == _NULL else result
            task.output_bytes += len(result)
            task.done_roots += 1
            task.inflight_roots -= 1
            task.grown += 1
            touched[task.task_id] = task
        for task in touched.values():
            self._after_progress(task, out, now_ms)
        self._check_rss(ex)
        if self._retiring:
            self._stop_retired(out)
        return out

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
        ex = self._executors.get(executor_id)
        if ex is not None and not cancel_on_executor:
            self._release(ex, call_id, now_ms)
        call = self._calls.get(call_id)
        out: list[DispatchCommand] = []
        if call is None or call.executor_id != executor_id:
            if self._retiring:
                self._stop_retired(out)
            return out
        if cancel_on_executor:
            out.append(CancelCalls(executor_id=executor_id, call_ids=[call_id]))
        if ex is not None:
            ex.calls.discard(call_id)
        call.executor_id = None
        self._attempt_failed(call, kind, message, now_ms, out, retryable=retryable)
        if self._retiring:
            self._stop_retired(out)
        return out

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
        parent = self._calls.get(parent_call_id)
        if parent is None or parent.executor_id != executor_id:
            return []
        child = self._new_call(
            parent.task, -1, parent_call_id, code, function, args, kwargs or None, parent.context
        )
        if child.kwargs is not None:
            parent.task.extras = True
        if parent.children is None:
            parent.children = []
        parent.children.append(child.call_id)
        out: list[DispatchCommand] = []
        self._send([child], out, now_ms)
        return out

    # ---- time ---------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[DispatchCommand]:
        """Time passed. The adapter samples each executor's CPU (``executor_sample``)
        just before, so an executor whose heartbeats a call starves (one holding the
        GIL) is seen working."""
        out: list[DispatchCommand] = []
        timeout = self._config.executor_heartbeat_timeout_ms
        quiet = [e for e in self._executors.values() if now_ms - e.alive_ms > timeout]
        for ex in quiet:  # none of them is sent a call again in this tick
            self._accepting.pop(ex.executor_id, None)
        self._check_holds(now_ms, out)
        for ex in quiet:
            if ex.executor_id not in self._executors or self._check_budget(ex, now_ms, out):
                continue
            silent = "no heartbeat and no CPU progress" if ex.measured else "no heartbeat"
            reason = f"{silent} for {now_ms - ex.alive_ms} ms"
            self._kill(ex, None, 0, reason, now_ms, out)
        self._send_restarts(out, now_ms)
        ready: list[Call] = []
        retries = self._retries
        while retries and retries[0][0] <= now_ms:
            _, call_id = heapq.heappop(retries)
            call = self._calls.get(call_id)
            if call is not None and call.retry_due:
                call.retry_due = False
                ready.append(call)
        if ready:
            self._send(ready, out, now_ms)
        if self._retiring:
            self._stop_retired(out)
        return out

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work: a retry falls due, an executor's sign of life
        is overdue, a call reaches its wall limit or a cancelled one its grace, or a
        running call could have reached its budget (sample its CPU then)."""
        deadlines = []
        timeout = self._config.executor_heartbeat_timeout_ms + 1
        for ex in self._executors.values():
            deadlines.append(ex.alive_ms + timeout)
            if ex.queue:
                held = self._hold_deadline(ex)
                if held is not None:
                    deadlines.append(held)
                budget = self._budget_deadline(ex)
                if budget is not None:
                    deadlines.append(budget)
        if self._retries:
            deadlines.append(self._retries[0][0])
        return min(deadlines) if deadlines else None
