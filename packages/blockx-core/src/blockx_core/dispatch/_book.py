"""CallBook: the DispatcherCore's state and the moves its events share.

The state: tasks (``TaskCalls``), every call still in the core (``Call``, by id),
the executors that are up and what each holds, calls waiting for an executor, and
the retry queue. The moves: dispatch root calls up to a task's window, place calls
on executors, fail an attempt (retry or fail for good), resume a parent, cancel
sub-calls, fail or converge a task, kill an executor and reschedule what it held.
Every move appends the commands it implies to ``out``.
"""

from __future__ import annotations

import heapq
from typing import Any

from blockx_core.calls import CallContext, RootCall
from blockx_core.dispatch._commands import (
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithResult,
)
from blockx_core.dispatch._config import DispatchConfig
from blockx_core.dispatch._failures import RETRYABLE, CallFailure, CallFailureKind, failure_text
from blockx_core.dispatch._placement import place
from blockx_core.dispatch._state import Call, Executor, TaskCalls, detach
from blockx_core.errors import FailureCode


class CallBook:
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

    def _new_root(self, task: TaskCalls, index: int, root: RootCall | list[Any]) -> Call:
        assert isinstance(root, RootCall)
        context = root.context
        if context is not None:
            task.set_context(index, context)
        kwargs = root.kwargs or None
        if kwargs is not None or context is not None:
            task.extras = True
        return self._new_call(task, index, 0, task.code, task.function, root.args, kwargs, context)

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
        new = [
            # The shorthand (a list of positional arguments) is the common case.
            new_call(task, base + i, 0, code, function, root, None, None)
            if type(root := pending[i]) is list
            else self._new_root(task, base + i, root)
            for i in range(start, start + n)
        ]
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
        out.extend(place(calls, self._executors, self._config.max_batch_calls))

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
        self._fail_task(
            task,
            FailureCode.CALL_FAILED,
            failure_text(call, kind, message),
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
        children, call.children = call.children, None
        cancels = detach(self._calls, self._executors, children)
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
        cancels = detach(self._calls, self._executors, list(task.live))
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
