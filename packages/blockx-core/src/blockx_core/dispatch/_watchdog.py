"""Watchdog: what each executor is running, for how long, at what CPU cost.

The Worker measures, the executor is not asked: which call holds an executor
follows from the messages (a call holds it from its ExecuteCalls or ResumeCall
until its next frame; the executor runs messages in arrival order, so the queue
head is the call on its CPU), wall time comes from ``now_ms``, and CPU from samples
of the executor's call-thread clock that the adapter reads from the kernel
(``executor_sample``) at frame boundaries and whenever ``next_deadline_ms`` falls
due, which includes the earliest moment the running call could pass its budget
(its CPU cannot run ahead of the wall clock).

One budget rule (``_budget.py``, applied by ``check_budget``): the call running
on an executor that has used more CPU + IO than its budget gets the executor killed
and fails BUDGET_EXCEEDED. A call that holds its executor past the wall limit fails
BUDGET_EXCEEDED and is cancelled; a call still holding an executor
``cancel_grace_ms`` after it was cancelled (over the wall limit, or its task ended)
gets the executor killed. An executor whose resident memory is over
``executor_max_rss_bytes`` while it runs nothing is retired.

When an executor ends (killed, or gone by itself), the call responsible is
charged: the one over its budget, else the one holding the executor (for a call
the core already let go, the call that awaits it), together with the calls on the
same executor awaiting it. Every other call there did nothing wrong: it is sent
again at once, without an attempt counted (``CallBook.reschedule_lost``).
"""

from __future__ import annotations

from typing import assert_never

from blockx_core.dispatch._book import CallBook
from blockx_core.dispatch._budget import Accounting, next_sample_ms, over_budget, used_us
from blockx_core.dispatch._commands import CancelCalls
from blockx_core.dispatch._state import Call, CallMove, Executor, Intake
from blockx_core.failures import CallFailureKind


class Watchdog:
    """What holds each executor of ``book`` and what it costs; see the module
    docstring. Its moves end calls and executors through the book."""

    def __init__(self, book: CallBook) -> None:
        self._book = book

    # ---- the queue ---------------------------------------------------------------------

    def release(self, ex: Executor, call_id: int, *, now_ms: int) -> None:
        """A frame of ``call_id`` arrived: it (and any entry before it, whose frame
        came in the same flush) no longer holds the executor."""
        if call_id not in ex.queued:
            return
        popped: list[int] = []
        queue = ex.queue
        while True:
            head = queue.popleft()
            del ex.queued[head]
            popped.append(head)
            if head == call_id:
                break
        self._credit(ex, popped, now_ms=now_ms)

    def unhold(self, ex: Executor, call_id: int, *, now_ms: int) -> None:
        """``call_id`` never reached the executor: it leaves its queue and holds
        nothing (the entries before it still run)."""
        if call_id not in ex.queued:
            return
        del ex.queued[call_id]
        if ex.queue[0] == call_id:
            ex.queue.popleft()
            ex.head_since_ms = now_ms
            ex.head_cpu_ns = ex.cpu_ns
            ex.head_waited_ns = ex.waited_ns
        else:
            ex.queue.remove(call_id)

    def advance(self, ex: Executor, running_call: int, *, now_ms: int) -> None:
        """The executor says it runs ``running_call``: the entries before it are done
        (their frames are still in its buffer). Only ever moves forward."""
        if running_call not in ex.queued or ex.queue[0] == running_call:
            return
        popped: list[int] = []
        while ex.queue[0] != running_call:
            head = ex.queue.popleft()
            del ex.queued[head]
            popped.append(head)
        self._credit(ex, popped, now_ms=now_ms)

    def _credit(self, ex: Executor, popped: list[int], *, now_ms: int) -> None:
        """Charge the head segment's CPU and wall time to the entries that shared it
        (evenly: the frame does not say how they split it) and start the next one."""
        cpu_ns, held_ms = self._head_segment(ex, now_ms=now_ms)
        calls = self._book.calls
        head = calls.get(popped[0])
        if head is not None and ex.waited_ns is not None and ex.head_waited_ns is not None:
            # The segment, whole, tells what the head's task's calls do (``_lanes.py``).
            waited_ns = ex.waited_ns - ex.head_waited_ns
            head.task.held.add(held_us=held_ms * 1000, busy_us=(cpu_ns + waited_ns) // 1000)
        k = len(popped)
        cpu_ns, held_ms = cpu_ns // k, held_ms // k
        orphaned = ex.orphaned
        executor_id = ex.executor_id
        # ``_charge`` inlined: this runs once per call of every frame.
        for call_id in popped:
            if orphaned:
                orphaned.pop(call_id, None)
            call = calls.get(call_id)
            if call is not None and call.executor_id == executor_id:
                call.cpu_ns += cpu_ns
                call.held_ms += held_ms
                usage = call.task.usage
                usage.cpu_ns += cpu_ns
                usage.held_ms += held_ms
        ex.head_since_ms = now_ms
        ex.head_cpu_ns = ex.cpu_ns
        ex.head_waited_ns = ex.waited_ns

    def _head_segment(self, ex: Executor, *, now_ms: int) -> tuple[int, int]:
        """CPU (ns) and wall time (ms) of the head's run so far."""
        cpu_ns = 0
        if ex.cpu_ns is not None and ex.head_cpu_ns is not None:
            cpu_ns = max(0, ex.cpu_ns - ex.head_cpu_ns)
        return cpu_ns, max(0, now_ms - ex.head_since_ms)

    def _charge(self, call: Call, *, cpu_ns: int, held_ms: int) -> None:
        call.cpu_ns += cpu_ns
        call.held_ms += held_ms
        usage = call.task.usage
        usage.cpu_ns += cpu_ns
        usage.held_ms += held_ms

    def _settle_head(self, ex: Executor, *, now_ms: int) -> Call | None:
        """Charge the running head what it used so far; return it if live here."""
        if not ex.queue:
            return None
        call = self._book.calls.get(ex.queue[0])
        if call is None or call.executor_id != ex.executor_id:
            return None
        cpu_ns, held_ms = self._head_segment(ex, now_ms=now_ms)
        self._charge(call, cpu_ns=cpu_ns, held_ms=held_ms)
        ex.head_since_ms = now_ms
        ex.head_cpu_ns = ex.cpu_ns
        ex.head_waited_ns = ex.waited_ns
        return call

    # ---- samples ---------------------------------------------------------------------

    def sampled(self, ex: Executor, *, cpu_ns: int, waited_ns: int | None, now_ms: int) -> None:
        """The kernel says the executor's call thread has used ``cpu_ns`` in all, and
        waited ``waited_ns`` for a CPU (None: not known). A clock that moved since the
        last sample is a sign of life."""
        if ex.cpu_ns is not None and cpu_ns > ex.cpu_ns:
            ex.alive_ms = max(ex.alive_ms, now_ms)
        ex.accounting = Accounting.MEASURED
        ex.cpu_ns = cpu_ns
        ex.sampled_ms = now_ms
        if ex.head_cpu_ns is None:
            ex.head_cpu_ns = cpu_ns
        if waited_ns is None or (ex.waited_ns is not None and waited_ns < ex.waited_ns):
            ex.head_waited_ns = None  # no longer known, or not the same clock
        elif ex.head_waited_ns is None:
            ex.head_waited_ns = waited_ns
        ex.waited_ns = waited_ns

    def check_rss(self, ex: Executor) -> None:
        """Retire an executor that runs nothing and is over the memory limit (what a
        call allocates while it runs does not count; what stays after it does)."""
        limit = self._book.config.executor_max_rss_bytes
        if ex.rss_bytes > limit and not ex.queue and ex.state is Intake.ACCEPTING:
            self._book.retire(
                ex,
                reason=f"its resident memory is {ex.rss_bytes} bytes between calls, over "
                f"EXECUTOR_MAX_RSS_BYTES ({limit})",
            )

    # ---- the budget ------------------------------------------------------------------

    def _held(self, ex: Executor, call_id: int) -> Call | None:
        """The call, if it is live and on ``ex`` (None: the core let it go)."""
        call = self._book.calls.get(call_id)
        return call if call is not None and call.executor_id == ex.executor_id else None

    def _running(self, ex: Executor, *, now_ms: int) -> tuple[Call | None, int, int] | None:
        """The call running on ``ex`` (None for one the core let go), what it has used
        this attempt (``used_us``) and its budget, in µs; None when nothing runs
        there. Measured, it is the head of the executor's queue; otherwise the call
        the executor last reported."""
        measured_us = reported_us = 0
        match ex.accounting:
            case Accounting.MEASURED:
                if not ex.queue:
                    return None
                call = self._held(ex, ex.queue[0])
                measured_us = self._head_segment(ex, now_ms=now_ms)[0] // 1000
                if call is not None:
                    measured_us += call.cpu_ns // 1000 + call.io_us
            case Accounting.REPORTED:
                if not ex.running_call:
                    return None
                call = self._held(ex, ex.running_call)
                reported_us = ex.running_us
            case _:
                assert_never(ex.accounting)
        used = used_us(
            ex.accounting,
            measured_us=measured_us,
            reported_us=reported_us,
            reported_ms=ex.alive_ms,
            now_ms=now_ms,
        )
        budget_us = self._book.budget_us if call is None else call.task.budget_ms * 1000
        return call, used, budget_us

    def check_budget(self, ex: Executor, *, now_ms: int) -> bool:
        """The budget rule (``_budget.over_budget``) for the call running on ``ex``
        (one the core let go: against the default budget): over it, the executor is
        killed and the call fails BUDGET_EXCEEDED. True when it was."""
        running = self._running(ex, now_ms=now_ms)
        if running is None or not over_budget(running[1], running[2]):
            return False
        call, used, _ = running
        if call is None:
            self._book.kill(ex, reason="a cancelled call kept running", now_ms=now_ms, used_us=used)
        else:
            if ex.accounting is Accounting.MEASURED:
                self._settle_head(ex, now_ms=now_ms)
            self._book.kill(
                ex,
                reason="a call exceeded its budget",
                now_ms=now_ms,
                over_budget=call,
                used_us=used,
            )
        return True

    def budget_deadline(self, ex: Executor) -> int | None:
        """When the running call could first be over its budget, counted from the
        last sample: the adapter samples again then (None: nothing to watch)."""
        if ex.accounting is not Accounting.MEASURED:
            return None
        running = self._running(ex, now_ms=ex.sampled_ms)
        if running is None:
            return None
        _, used, budget_us = running
        return next_sample_ms(sampled_ms=ex.sampled_ms, used=used, budget_us=budget_us)

    # ---- time ---------------------------------------------------------------------------

    def hold_deadline(self, ex: Executor) -> int | None:
        """When the head's wall limit or its cancel grace runs out (None: idle)."""
        if not ex.queue:
            return None
        head = ex.queue[0]
        call = self._book.calls.get(head)
        if call is not None and call.executor_id == ex.executor_id:
            return ex.head_since_ms + self._book.config.wall_limit_ms - call.held_ms + 1
        since = max(ex.head_since_ms, ex.orphaned.get(head, ex.head_since_ms))
        return since + self._book.config.cancel_grace_ms

    def check_holds(self, *, now_ms: int) -> None:
        book = self._book
        config = book.config
        for ex in list(book.executors.values()):
            deadline = self.hold_deadline(ex)
            if deadline is None or now_ms < deadline or ex.executor_id not in book.executors:
                continue
            call = self._settle_head(ex, now_ms=now_ms)
            if call is None:
                book.kill(
                    ex,
                    reason=f"a cancelled call still held it {config.cancel_grace_ms} ms later",
                    now_ms=now_ms,
                )
                continue
            # Over the wall limit: the call fails now; its executor is killed if the
            # call still holds it after the grace.
            ex.calls.discard(call.call_id)
            ex.orphaned[call.call_id] = now_ms
            call.move(CallMove.LEAVE)
            book.outbox.append(CancelCalls(executor_id=ex.executor_id, call_ids=[call.call_id]))
            book.attempt_failed(
                call,
                kind=CallFailureKind.BUDGET_EXCEEDED,
                message=f"the call held its executor {call.held_ms} ms of wall time, over "
                f"CALL_WALL_LIMIT_MS ({config.wall_limit_ms} ms)",
                now_ms=now_ms,
            )
