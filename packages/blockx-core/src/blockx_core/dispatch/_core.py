"""DispatcherCore: the sans-IO engine of the Calls phase.

It owns, per task, a TaskCalls record (root calls, a window that doubles from
``initial_window`` up to ``task_max_inflight_calls``, outputs in root order), the
calls in flight and which executor holds each, bounded attempt retries, sub-calls
bound to their parents, and the executors' liveness. Its inputs are events (calls
completed or failed, a call waiting on a sub-call, executor up / heartbeat / lost,
``tick``); its outputs are commands (``SendCalls``, ``CancelCalls``,
``ResumeWithResult``, ``KillExecutor``, ``ConvergeTaskCalls``). It never reads a
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
* Outputs (JSON texts of the root calls' results) are collected in root order; more
  than ``max_collected_output_bytes`` in total converges OUTPUT_BYTES_EXCEEDED.
* A sub-call is a new call bound to its parent (and inherits its context); its
  result resumes the parent and never appears in the outputs. Sub-calls bypass the
  task window, so a window full of waiting parents cannot deadlock.
* A failed attempt is retried (with back-off) when its kind is in the retry policy,
  attempts remain and the attempt did not say a retry cannot succeed; a result
  from an attempt the core no longer expects (its executor was declared lost, the
  task ended) is ignored, so no call is reported twice.
* An executor whose running call is over budget, or that stopped heartbeating, is
  killed; the over-budget call fails BUDGET_EXCEEDED, the others on it are retried
  as EXECUTOR_LOST.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from blockx_core.calls import CallContext, RootCall
from blockx_core.dispatch._commands import (
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithResult,
    SendCalls,
)
from blockx_core.dispatch._config import DispatchConfig
from blockx_core.dispatch._failures import RETRYABLE, CallFailure, CallFailureKind
from blockx_core.dispatch._placement import water_fill
from blockx_core.dispatch._state import Call, Executor, TaskCalls
from blockx_core.errors import BlockxUsageError, FailureCode


class DispatcherCore:
    """See the module docstring."""

    def __init__(self, config: DispatchConfig | None = None) -> None:
        self._config = config or DispatchConfig()
        self._config.validate()
        self._budget_us = self._config.call_deadline_ms * 1000
        self._executors: dict[str, Executor] = {}
        self._tasks: dict[str, TaskCalls] = {}
        self._calls: dict[int, Call] = {}
        self._next_call_id = 1
        self._unassigned: list[Call] = []  # waiting for an executor to come up
        self._retries: list[tuple[int, int]] = []  # (due_ms, call_id), lazily invalidated

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

    def call_task(self, call_id: int) -> str | None:
        call = self._calls.get(call_id)
        return None if call is None else call.task.task_id

    def call_code(self, call_id: int) -> str | None:
        call = self._calls.get(call_id)
        return None if call is None else call.code

    def live_calls(self) -> int:
        return len(self._calls)

    # ---- executors -------------------------------------------------------------------

    def executor_up(self, executor_id: str, now_ms: int) -> list[DispatchCommand]:
        if executor_id in self._executors:
            raise BlockxUsageError(f"executor {executor_id!r} is already up")
        self._executors[executor_id] = Executor(executor_id, now_ms)
        out: list[DispatchCommand] = []
        if self._unassigned:
            waiting, self._unassigned = self._unassigned, []
            self._send(waiting, out)
        return out

    def executor_heartbeat(
        self, executor_id: str, running_call: int, running_us: int, now_ms: int
    ) -> list[DispatchCommand]:
        ex = self._executors.get(executor_id)
        if ex is None:
            return []
        ex.last_heartbeat_ms = now_ms
        ex.running_call = running_call
        ex.running_us = running_us
        out: list[DispatchCommand] = []
        if not running_call:
            return out
        call = self._calls.get(running_call)
        if call is not None and call.executor_id == executor_id:
            if running_us > call.task.budget_ms * 1000:
                self._kill(ex, call, running_us, "a call exceeded its budget", now_ms, out)
        elif running_us > self._budget_us:
            # A call the core already let go (its task was cancelled or timed out) is
            # still on the CPU past any budget: only killing its executor stops it.
            self._kill(ex, None, running_us, "a cancelled call kept running", now_ms, out)
        return out

    def executor_lost(self, executor_id: str, reason: str, now_ms: int) -> list[DispatchCommand]:
        """The executor's process or connection is gone (no kill needed)."""
        ex = self._executors.pop(executor_id, None)
        out: list[DispatchCommand] = []
        if ex is not None:
            self._reschedule_lost(
                ex, None, 0, f"executor {executor_id} lost: {reason}", now_ms, out
            )
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
            self._fill(task, out)
        return out

    def roots_done(self, task_id: str, now_ms: int) -> list[DispatchCommand]:
        """The task's source has no more root calls: it converges once they finish."""
        task = self._tasks.get(task_id)
        if task is None or task.source_done:
            return []
        task.source_done = True
        out: list[DispatchCommand] = []
        self._after_progress(task, out)
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
            self._drop_calls(task, out)
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
        for call_id, result in zip(call_ids, results, strict=True):
            call = calls.get(call_id)
            if call is None or call.executor_id != executor_id:
                continue  # cancelled, or an attempt the core no longer expects
            del calls[call_id]
            ex_calls.discard(call_id)
            task = call.task
            task.live.discard(call_id)
            if call.children:
                self._cancel_children(call, out)  # nothing can await them any more
            if call.parent:
                self._resume_parent(call, True, result, "", "", out)
                continue
            task.outputs[call.root_index] = result
            task.output_bytes += len(result)
            task.done_roots += 1
            task.inflight_roots -= 1
            task.grown += 1
            touched[task.task_id] = task
        for task in touched.values():
            self._after_progress(task, out)
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
        call = self._calls.get(call_id)
        if call is None or call.executor_id != executor_id:
            return []
        out: list[DispatchCommand] = []
        if cancel_on_executor:
            out.append(CancelCalls(executor_id=executor_id, call_ids=[call_id]))
        ex = self._executors.get(executor_id)
        if ex is not None:
            ex.calls.discard(call_id)
        call.executor_id = None
        self._attempt_failed(call, kind, message, now_ms, out, retryable=retryable)
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
        with the parent's context."""
        parent = self._calls.get(parent_call_id)
        if parent is None or parent.executor_id != executor_id:
            return []
        child = self._new_call(
            parent.task, -1, parent_call_id, code, function, args, kwargs or None, parent.context
        )
        if parent.children is None:
            parent.children = []
        parent.children.append(child.call_id)
        out: list[DispatchCommand] = []
        self._send([child], out)
        return out

    # ---- time ---------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[DispatchCommand]:
        out: list[DispatchCommand] = []
        timeout = self._config.executor_heartbeat_timeout_ms
        for ex in [e for e in self._executors.values() if now_ms - e.last_heartbeat_ms > timeout]:
            silent_ms = now_ms - ex.last_heartbeat_ms
            blamed = self._calls.get(ex.running_call) if ex.running_call else None
            used_us = ex.running_us + silent_ms * 1000
            if blamed is not None and (
                blamed.executor_id != ex.executor_id or used_us <= blamed.task.budget_ms * 1000
            ):
                blamed = None
            self._kill(ex, blamed, used_us, f"no heartbeat for {silent_ms} ms", now_ms, out)
        ready: list[Call] = []
        retries = self._retries
        while retries and retries[0][0] <= now_ms:
            _, call_id = heapq.heappop(retries)
            call = self._calls.get(call_id)
            if call is not None and call.retry_due:
                call.retry_due = False
                ready.append(call)
        if ready:
            self._send(ready, out)
        return out

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work: a retry falls due or a heartbeat times out."""
        deadlines = [
            ex.last_heartbeat_ms + self._config.executor_heartbeat_timeout_ms + 1
            for ex in self._executors.values()
        ]
        if self._retries:
            deadlines.append(self._retries[0][0])
        return min(deadlines) if deadlines else None

    # ---- internals ----------------------------------------------------------------------

    def _new_call(
        self,
        task: TaskCalls,
        root_index: int,
        parent: int,
        code: str,
        function: str,
        args: list[Any],
        kwargs: dict[str, Any] | None,
        context: CallContext | None,
    ) -> Call:
        call_id = self._next_call_id
        self._next_call_id = call_id + 1
        call = Call(call_id, task, root_index, parent, code, function, args, kwargs, context)
        self._calls[call_id] = call
        task.live.add(call_id)
        return call

    def _fill(self, task: TaskCalls, out: list[DispatchCommand]) -> None:
        """Dispatch new root calls up to the task's window."""
        n = min(task.window - task.inflight_roots, task.undispatched())
        if n <= 0:
            return
        start = task.next_root
        pending = task.pending
        base = task.base
        code, function = task.code, task.function
        new_call = self._new_call
        new: list[Call] = []
        for i in range(start, start + n):
            root = pending[i]
            if type(root) is list:  # the shorthand: positional arguments only
                new.append(new_call(task, base + i, 0, code, function, root, None, None))
                continue
            assert isinstance(root, RootCall)
            context = root.context
            if context is not None:
                task.set_context(base + i, context)
            new.append(
                new_call(task, base + i, 0, code, function, root.args, root.kwargs or None, context)
            )
        task.next_root = start + n
        task.inflight_roots += n
        self._send(new, out)

    def _after_progress(self, task: TaskCalls, out: list[DispatchCommand]) -> None:
        if task.task_id not in self._tasks:
            return
        if task.output_bytes > self._config.max_collected_output_bytes:
            self._fail_task(
                task,
                FailureCode.OUTPUT_BYTES_EXCEEDED,
                f"the calls' outputs exceed MAX_COLLECTED_OUTPUT_BYTES "
                f"({task.output_bytes} > {self._config.max_collected_output_bytes} bytes)",
                out,
            )
            return
        if task.converged():
            del self._tasks[task.task_id]
            self._drop_calls(task, out)  # anything still live can no longer matter
            out.append(
                ConvergeTaskCalls(task_id=task.task_id, success=True, outputs=task.tagged_outputs())
            )
            return
        limit = self._config.task_max_inflight_calls
        if task.grown >= task.window and task.window < limit:
            task.window = min(limit, task.window * 2)
            task.grown = 0
        self._fill(task, out)

    def _send(self, calls: list[Call], out: list[DispatchCommand]) -> None:
        """Assign calls to executors, spreading by load, in batches per function."""
        if not self._executors:
            self._unassigned.extend(calls)
            return
        first = calls[0]
        if all(
            c.task is first.task and c.code == first.code and c.function == first.function
            for c in calls
        ):
            groups: Iterator[list[Call]] = iter([calls])
        else:
            by_key: dict[tuple[str, str, str], list[Call]] = defaultdict(list)
            for call in calls:
                by_key[(call.task.task_id, call.code, call.function)].append(call)
            groups = iter(by_key.values())
        max_batch = self._config.max_batch_calls
        for group in groups:
            head = group[0]
            budget_ms = head.task.budget_ms
            # Columns for keyword arguments and contexts only when some call has them.
            with_kwargs = any(c.kwargs is not None for c in group)
            with_contexts = any(c.context is not None for c in group)
            offset = 0
            for ex, share in water_fill(self._executors.values(), len(group)):
                ex_id = ex.executor_id
                ex_calls = ex.calls
                for lo in range(offset, offset + share, max_batch):
                    batch = group[lo : min(lo + max_batch, offset + share)]
                    for call in batch:
                        call.executor_id = ex_id
                        ex_calls.add(call.call_id)
                    out.append(
                        SendCalls(
                            executor_id=ex_id,
                            task_id=head.task.task_id,
                            code=head.code,
                            function=head.function,
                            budget_ms=budget_ms,
                            call_ids=[c.call_id for c in batch],
                            args=[c.args for c in batch],
                            kwargs=[c.kwargs or {} for c in batch] if with_kwargs else None,
                            contexts=[c.context for c in batch] if with_contexts else None,
                        )
                    )
                offset += share

    def _attempt_failed(
        self,
        call: Call,
        kind: CallFailureKind,
        message: str,
        now_ms: int,
        out: list[DispatchCommand],
        *,
        retryable: bool = True,
    ) -> None:
        self._cancel_children(call, out)
        policy = self._config.retry
        if retryable and kind in policy.retry_on and call.attempt < policy.max_attempts:
            due = now_ms + policy.backoff_for(call.attempt)
            call.attempt += 1
            call.retry_due = True
            heapq.heappush(self._retries, (due, call.call_id))
            return
        self._terminal_failure(call, kind, message, retryable and RETRYABLE[kind], out)

    def _terminal_failure(
        self,
        call: Call,
        kind: CallFailureKind,
        message: str,
        retryable: bool,
        out: list[DispatchCommand],
    ) -> None:
        del self._calls[call.call_id]
        task = call.task
        task.live.discard(call.call_id)
        if call.parent:
            self._resume_parent(call, False, b"null", kind.value, message, out, retryable)
            return
        attempts = f" after {call.attempt} attempts" if call.attempt > 1 else ""
        self._fail_task(
            task,
            FailureCode.CALL_FAILED,
            f"call #{call.root_index} {call.function}({_short_args(call.args, call.kwargs)}) "
            f"failed{attempts}: {kind.value}: {message}",
            out,
            CallFailure(
                index=call.root_index,
                kind=kind,
                message=message,
                attempts=call.attempt,
                retryable=retryable,
            ),
        )

    def _resume_parent(
        self,
        child: Call,
        ok: bool,
        value_json: bytes,
        error_kind: str,
        error: str,
        out: list[DispatchCommand],
        retryable: bool = False,
    ) -> None:
        parent = self._calls.get(child.parent)
        if parent is None or parent.executor_id is None:
            return  # the parent is gone or being retried: it will ask again
        if parent.children is not None:
            parent.children.remove(child.call_id)
        out.append(
            ResumeWithResult(
                executor_id=parent.executor_id,
                call_id=parent.call_id,
                ok=ok,
                value_json=value_json,
                error_kind=error_kind,
                error=error,
                retryable=retryable,
            )
        )

    def _cancel_children(self, call: Call, out: list[DispatchCommand]) -> None:
        """A parent attempt ended: its sub-calls (and theirs) are no longer wanted."""
        if not call.children:
            return
        cancels: dict[str, list[int]] = defaultdict(list)
        stack = list(call.children)
        call.children = None
        while stack:
            child = self._calls.pop(stack.pop(), None)
            if child is None:
                continue
            child.task.live.discard(child.call_id)
            if child.executor_id is not None:
                cancels[child.executor_id].append(child.call_id)
                ex = self._executors.get(child.executor_id)
                if ex is not None:
                    ex.calls.discard(child.call_id)
            if child.children:
                stack.extend(child.children)
        out.extend(CancelCalls(executor_id=e, call_ids=ids) for e, ids in cancels.items())

    def _fail_task(
        self,
        task: TaskCalls,
        code: FailureCode,
        message: str,
        out: list[DispatchCommand],
        failed_call: CallFailure | None = None,
    ) -> None:
        del self._tasks[task.task_id]
        self._drop_calls(task, out)
        out.append(
            ConvergeTaskCalls(
                task_id=task.task_id,
                success=False,
                failure_code=code,
                failure_message=message,
                failed_call=failed_call,
            )
        )

    def _drop_calls(self, task: TaskCalls, out: list[DispatchCommand]) -> None:
        cancels: dict[str, list[int]] = defaultdict(list)
        for call_id in task.live:
            call = self._calls.pop(call_id)
            if call.executor_id is not None:
                cancels[call.executor_id].append(call_id)
                ex = self._executors.get(call.executor_id)
                if ex is not None:
                    ex.calls.discard(call_id)
        task.live.clear()
        self._unassigned = [c for c in self._unassigned if c.task is not task]
        out.extend(CancelCalls(executor_id=e, call_ids=sorted(ids)) for e, ids in cancels.items())

    def _kill(
        self,
        ex: Executor,
        over_budget: Call | None,
        used_us: int,
        reason: str,
        now_ms: int,
        out: list[DispatchCommand],
    ) -> None:
        del self._executors[ex.executor_id]
        out.append(KillExecutor(executor_id=ex.executor_id, reason=reason))
        self._reschedule_lost(
            ex, over_budget, used_us, f"executor {ex.executor_id} killed: {reason}", now_ms, out
        )

    def _reschedule_lost(
        self,
        ex: Executor,
        over_budget: Call | None,
        used_us: int,
        reason: str,
        now_ms: int,
        out: list[DispatchCommand],
    ) -> None:
        """Every call the executor held fails this attempt (the culprit for good)."""
        lost = [self._calls[c] for c in sorted(ex.calls) if c in self._calls]
        ex.calls.clear()
        for call in lost:
            call.executor_id = None
        if over_budget is not None and over_budget in lost:
            lost.remove(over_budget)
            self._attempt_failed(
                over_budget,
                CallFailureKind.BUDGET_EXCEEDED,
                f"the call used {used_us // 1000} ms of CPU and IO time, over its budget of "
                f"{over_budget.task.budget_ms} ms; its executor was killed",
                now_ms,
                out,
            )
        for call in lost:
            if call.call_id in self._calls and call.task.task_id in self._tasks:
                self._attempt_failed(call, CallFailureKind.EXECUTOR_LOST, reason, now_ms, out)


def _short_args(args: list[Any], kwargs: dict[str, Any] | None, limit: int = 120) -> str:
    parts = [repr(a) for a in args]
    if kwargs:
        parts += [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."
