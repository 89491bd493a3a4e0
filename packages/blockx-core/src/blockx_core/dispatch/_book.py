"""CallBook: the DispatcherCore's state and the moves its events share.

The state: tasks (``TaskCalls``), every call still in the core (``Call``, by id),
the executors that are up and what each holds, calls waiting for an executor, and
the retry queue. The moves: dispatch root calls up to a task's window, place calls
on executors, fail an attempt (retry or fail for good), resume a parent, cancel
sub-calls, fail or converge a task, kill an executor and reschedule what it held.
Every move appends the commands it implies to ``outbox``, the list the
``DispatcherCore`` holding the book drains at the end of each event.
"""

from __future__ import annotations

import heapq
from typing import Any

from blockx_core.calls import CallContext, RootCall
from blockx_core.dispatch._commands import (
    CallsConverged,
    CallsFailed,
    CancelCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithResult,
    RetireExecutor,
    SubCallFailed,
    SubCallResult,
)
from blockx_core.dispatch._config import DispatchConfig
from blockx_core.dispatch._failures import CallFailure, failure_text
from blockx_core.dispatch._lanes import lanes
from blockx_core.dispatch._placement import place
from blockx_core.dispatch._state import (
    Call,
    CallMove,
    CallState,
    Executor,
    Intake,
    TaskCalls,
    detach,
    hold,
    hold_all,
)
from blockx_core.failures import CallFailureKind, Failure, FailureCode, is_retryable


class CallBook:
    """The records of one DispatcherCore and the moves on them; see the module
    docstring. Its attributes are the core's and its watchdog's to read and change."""

    def __init__(self, config: DispatchConfig, outbox: list[DispatchCommand]) -> None:
        self.config = config
        self.outbox = outbox
        self.budget_us = config.call_deadline_ms * 1000
        self.executors: dict[str, Executor] = {}
        # The executors new calls may go to (not retiring), and the retiring ones
        # with the reason why.
        self.accepting: dict[str, Executor] = {}
        self.retiring: dict[str, str] = {}
        self.tasks: dict[str, TaskCalls] = {}
        self.calls: dict[int, Call] = {}
        self._next_call_id = 1
        self.unassigned: list[Call] = []  # waiting for an executor to come up
        self.retries: list[tuple[int, int]] = []  # (due_ms, call_id), lazily invalidated
        # Calls of ended executors that did nothing wrong, sent again uncharged once
        # the event that ended them is through (``send_restarts``).
        self.restarts: list[Call] = []

    def new_call(
        self,
        task: TaskCalls,
        *,
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
        self.calls[call_id] = call
        task.live.add(call_id)
        return call

    def _new_root(self, task: TaskCalls, *, index: int, root: RootCall | list[Any]) -> Call:
        assert isinstance(root, RootCall)
        context = root.context
        if context is not None:
            task.set_context(index, context)
        kwargs = root.kwargs or None
        if kwargs is not None or context is not None:
            task.extras = True
        return self.new_call(
            task,
            root_index=index,
            parent=0,
            code=task.code,
            function=task.function,
            args=root.args,
            kwargs=kwargs,
            context=context,
        )

    def fill(self, task: TaskCalls, *, now_ms: int) -> None:
        """Dispatch new root calls up to the task's window."""
        n = min(task.window - task.inflight_roots, task.undispatched())
        if n <= 0:
            return
        start = task.next_root
        pending = task.pending
        base = task.base
        code, function = task.code, task.function
        calls, live = self.calls, task.live
        new: list[Call] = []
        for i in range(start, start + n):
            root = pending[i]
            if type(root) is list:
                # The shorthand (a list of positional arguments), the common case:
                # ``new_call`` inlined, since this runs once per root call.
                call_id = self._next_call_id
                self._next_call_id = call_id + 1
                call = Call(call_id, task, base + i, 0, code, function, root, None, None)
                calls[call_id] = call
                live.add(call_id)
            else:
                call = self._new_root(task, index=base + i, root=root)
            new.append(call)
        task.next_root = start + n
        task.inflight_roots += n
        self.send(new, now_ms=now_ms, roots_of_one_task=True)

    def after_progress(self, task: TaskCalls, *, now_ms: int) -> None:
        if task.task_id not in self.tasks:
            return
        if task.output_bytes > self.config.max_collected_output_bytes:
            self.fail_task(
                task,
                code=FailureCode.OUTPUT_BYTES_EXCEEDED,
                message=f"the calls' outputs exceed MAX_COLLECTED_OUTPUT_BYTES "
                f"({task.output_bytes} > {self.config.max_collected_output_bytes} bytes)",
                now_ms=now_ms,
            )
            return
        if task.converged():
            del self.tasks[task.task_id]
            self.drop_calls(task, now_ms=now_ms)  # anything still live can no longer matter
            self.outbox.append(CallsConverged(task_id=task.task_id, outputs=task.tagged_outputs()))
            return
        limit = self.config.task_max_inflight_calls
        if task.grown >= task.window and task.window < limit:
            task.window = min(limit, task.window * 2)
            task.grown = 0
        self.fill(task, now_ms=now_ms)

    def send(self, calls: list[Call], *, now_ms: int, roots_of_one_task: bool = False) -> None:
        """Assign calls to the executors that take new calls, spreading by load, in
        batches per function; none gets more than its EXECUTOR_MAX_CALLS.
        ``roots_of_one_task``: the calls are root calls of one task (a window's
        refill), so they need no grouping and have no parent, and they go to the
        task's CPU lanes while its calls keep their executors busy (``_lanes.py``)."""
        accepting = self.accepting
        max_calls = self.config.executor_max_calls
        cpu_lanes = self.config.cpu_lanes
        task = calls[0].task if calls and roots_of_one_task else None
        while calls:
            if not accepting:
                self.unassigned.extend(calls)
                return
            # No executor can take more than the least room left: a chunk that size
            # never overfills one (the common case is one chunk of everything).
            room = min(max_calls - ex.started for ex in accepting.values())
            chunk, calls = calls[:room], calls[room:]
            # Sub-calls (rare next to root calls) are queued with their parent.
            parents = {} if roots_of_one_task else {c.call_id: c.parent for c in chunk if c.parent}
            max_batch = self.config.max_batch_calls
            targets = accepting
            if task is not None and 0 < cpu_lanes < len(accepting) and task.held.cpu_bound:
                loads = {i: len(ex.calls) for i, ex in accepting.items()}
                task.lanes = lanes(task.lanes, loads, cpu_lanes)
                targets = {i: accepting[i] for i in task.lanes}
            for send in place(chunk, targets, max_batch, one_group=roots_of_one_task):
                ex = accepting[send.executor_id]
                ex.started += len(send.call_ids)
                hold_all(ex, send.call_ids, parents, now_ms=now_ms)
                self.outbox.append(send)
            for ex in [e for e in accepting.values() if e.started >= max_calls]:
                self.retire(ex, reason=f"it has run {ex.started} calls (EXECUTOR_MAX_CALLS)")

    def retire(self, ex: Executor, *, reason: str) -> None:
        """Send it no more calls; it is stopped once it holds none (``stop_retired``)."""
        ex.state = Intake.RETIRING
        self.accepting.pop(ex.executor_id, None)
        self.retiring[ex.executor_id] = reason

    def stop_retired(self) -> None:
        for executor_id in [e for e in self.retiring if self._idle(e)]:
            reason = self.retiring.pop(executor_id)
            del self.executors[executor_id]
            self.outbox.append(RetireExecutor(executor_id=executor_id, reason=reason))

    def _idle(self, executor_id: str) -> bool:
        ex = self.executors.get(executor_id)
        return ex is not None and not ex.calls and not ex.queue

    def attempt_failed(
        self,
        call: Call,
        *,
        kind: CallFailureKind,
        message: str,
        now_ms: int,
        retryable: bool = True,
    ) -> None:
        self.cancel_children(call, now_ms=now_ms)
        policy = self.config.retry
        retry = retryable and kind in policy.retry_on and call.attempt < policy.max_attempts
        call.task.record_failure(call, kind, message, retried=retry)
        if retry:
            due = now_ms + policy.backoff_for(call.attempt)
            call.attempt += 1
            call.move(CallMove.BACK_OFF)
            heapq.heappush(self.retries, (due, call.call_id))
            call.cpu_ns = call.io_us = call.held_ms = 0  # the budget is per attempt
            return
        self._terminal_failure(
            call,
            kind=kind,
            message=message,
            retryable=retryable and is_retryable(kind),
            now_ms=now_ms,
        )

    def _terminal_failure(
        self,
        call: Call,
        *,
        kind: CallFailureKind,
        message: str,
        retryable: bool,
        now_ms: int,
    ) -> None:
        del self.calls[call.call_id]
        task = call.task
        task.live.discard(call.call_id)
        if call.parent:
            failure = Failure(kind, message, retryable)
            self.resume_parent(call, result=SubCallFailed(failure=failure), now_ms=now_ms)
            return
        self.fail_task(
            task,
            code=FailureCode.CALL_FAILED,
            message=failure_text(call, kind, message),
            now_ms=now_ms,
            failed_call=CallFailure(
                index=call.root_index,
                kind=kind,
                message=message,
                attempts=call.attempt,
                retryable=retryable,
                args=call.args,
                kwargs=call.kwargs,
            ),
        )

    def resume_parent(
        self,
        child: Call,
        *,
        result: SubCallResult,
        now_ms: int,
    ) -> None:
        parent = self.calls.get(child.parent)
        if parent is None or parent.executor_id is None or parent.state is not CallState.PLACED:
            return  # the parent is gone or being retried: it will ask again
        if parent.children is not None:
            parent.children.remove(child.call_id)
        ex = self.executors.get(parent.executor_id)
        if ex is not None:
            hold(ex, parent.call_id, now_ms=now_ms, parent=parent.parent)
        self.outbox.append(
            ResumeWithResult(executor_id=parent.executor_id, call_id=parent.call_id, result=result)
        )

    def cancel_children(self, call: Call, *, now_ms: int) -> None:
        """A parent attempt ended: its sub-calls (and theirs) are no longer wanted."""
        if not call.children:
            return
        children, call.children = call.children, None
        cancels = detach(self.calls, self.executors, children, now_ms=now_ms)
        self.outbox.extend(CancelCalls(executor_id=e, call_ids=ids) for e, ids in cancels.items())

    def fail_task(
        self,
        task: TaskCalls,
        *,
        code: FailureCode,
        message: str,
        now_ms: int,
        failed_call: CallFailure | None = None,
    ) -> None:
        del self.tasks[task.task_id]
        self.drop_calls(task, now_ms=now_ms)
        self.outbox.append(
            CallsFailed(
                task_id=task.task_id,
                failure_code=code,
                failure_message=message,
                failed_call=failed_call,
                call_failures=tuple(task.failures),
                call_failures_omitted=task.failures_omitted,
            )
        )

    def function_missing(self, task: TaskCalls, *, message: str, now_ms: int) -> None:
        """A root call of a function the adapter cannot resolve: the task fails at
        once, the root call charged FUNCTION_NOT_FOUND (it never ran)."""
        kind = CallFailureKind.FUNCTION_NOT_FOUND
        self.fail_task(
            task,
            code=FailureCode.CALL_FAILED,
            message=f"{kind.value}: {message}",
            now_ms=now_ms,
            failed_call=CallFailure(
                index=task.base + task.next_root,
                kind=kind,
                message=message,
                retryable=is_retryable(kind),
            ),
        )

    def drop_calls(self, task: TaskCalls, *, now_ms: int) -> None:
        cancels = detach(self.calls, self.executors, list(task.live), now_ms=now_ms)
        self.unassigned = [c for c in self.unassigned if c.task is not task]
        self.outbox.extend(
            CancelCalls(executor_id=e, call_ids=sorted(ids)) for e, ids in cancels.items()
        )

    def kill(
        self,
        ex: Executor,
        *,
        reason: str,
        now_ms: int,
        over_budget: Call | None = None,
        used_us: int = 0,
    ) -> None:
        del self.executors[ex.executor_id]
        self.accepting.pop(ex.executor_id, None)
        self.retiring.pop(ex.executor_id, None)
        culprit = over_budget.call_id if over_budget and over_budget.call_id in ex.calls else None
        self.outbox.append(
            KillExecutor(executor_id=ex.executor_id, reason=reason, over_budget_call_id=culprit)
        )
        self.reschedule_lost(
            ex,
            reason=f"executor {ex.executor_id} killed: {reason}",
            now_ms=now_ms,
            over_budget=over_budget,
            used_us=used_us,
        )

    def reschedule_lost(
        self,
        ex: Executor,
        *,
        reason: str,
        now_ms: int,
        over_budget: Call | None = None,
        used_us: int = 0,
    ) -> None:
        """Every call the executor held ends this attempt. The call responsible and
        the calls there awaiting it are charged (the culprit fails for good, the
        others as EXECUTOR_LOST); the rest are sent again at once, uncharged."""
        lost = [self.calls[c] for c in sorted(ex.calls) if c in self.calls]
        charged = self._responsible(ex, over_budget=over_budget)
        ex.calls.clear()
        for call in lost:
            call.move(CallMove.LEAVE)
        uncharged: list[Call] = []
        for call in lost:
            if call.call_id not in self.calls or call.task.task_id not in self.tasks:
                continue  # gone with a parent's attempt, or its task failed meanwhile
            if call is over_budget:
                self.attempt_failed(
                    call,
                    kind=CallFailureKind.BUDGET_EXCEEDED,
                    message=f"the call used {used_us // 1000} ms of CPU and IO time, over its "
                    f"budget of {call.task.budget_ms} ms; its executor was killed",
                    now_ms=now_ms,
                )
            elif call.call_id in charged:
                self.attempt_failed(
                    call, kind=CallFailureKind.EXECUTOR_LOST, message=reason, now_ms=now_ms
                )
            else:
                uncharged.append(call)
        for call in uncharged:
            if call.call_id in self.calls:
                self.cancel_children(call, now_ms=now_ms)  # it starts again from the top
                call.cpu_ns = call.io_us = call.held_ms = 0
                self.restarts.append(call)

    def send_restarts(self, *, now_ms: int) -> None:
        """Send the uncharged calls of ended executors again (those still wanted),
        after every executor the event ended is gone: none goes to one of them, and
        none is sent and cancelled in the same step."""
        calls, self.restarts = self.restarts, []
        calls = [c for c in calls if c.call_id in self.calls and c.task.task_id in self.tasks]
        if calls:
            self.send(calls, now_ms=now_ms)

    def _responsible(self, ex: Executor, *, over_budget: Call | None) -> set[int]:
        """The calls an executor's end is charged to: the call over its budget, else
        the call holding the executor (for one no longer held there, the call that
        made it), with the calls on ``ex`` that await it, transitively."""
        if over_budget is not None:
            call_id = over_budget.call_id
        elif ex.queue:
            head = ex.queue[0]
            call_id = head if head in ex.calls else ex.queued[head]
        else:
            return set()
        charged: set[int] = set()
        while call_id in ex.calls:
            charged.add(call_id)
            call = self.calls.get(call_id)
            call_id = 0 if call is None else call.parent
        return charged
