"""The DispatcherCore's records: one per task, per call in the core, per executor."""

from __future__ import annotations

import enum
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from blockx_core.calls import CallContext, RootCall, RootOutputs
from blockx_core.dispatch._budget import Accounting
from blockx_core.dispatch._lanes import HeldTime
from blockx_core.failures import CallFailureKind
from blockx_core.task import CALL_FAILURE_MESSAGE_CHARS, MAX_CALL_FAILURES, CallFailureSummary


class CallUsage:
    """What a task's calls cost, measured by the Worker (every attempt counts): CPU
    of the executor's call thread, IO backend time, and the wall time the calls held
    an executor (running, not suspended on IO or a sub-call). The adapter keeps a
    reference (``DispatcherCore.usage``); the core adds to it until the task ends."""

    __slots__ = ("cpu_ns", "held_ms", "io_us")

    def __init__(self) -> None:
        self.cpu_ns = 0
        self.io_us = 0
        self.held_ms = 0


class TaskCalls:
    """One task's Calls phase.

    Root calls arrive in chunks (``add``) until the source says it is done; each
    gets the next root index. ``pending[next_root:]`` are the roots not yet
    dispatched, and ``pending[0]`` has root index ``base``, so a producer that
    streams roots never makes the core keep the dispatched ones.
    """

    __slots__ = (
        "added",
        "base",
        "budget_ms",
        "code",
        "contexts",
        "done_roots",
        "extras",
        "failures",
        "failures_omitted",
        "function",
        "grown",
        "held",
        "inflight_roots",
        "lanes",
        "live",
        "missing",
        "next_root",
        "output_bytes",
        "outputs",
        "pending",
        "source_done",
        "taken",
        "task_id",
        "usage",
        "window",
    )

    def __init__(self, task_id: str, code: str, function: str, window: int, budget_ms: int) -> None:
        self.task_id = task_id
        self.usage = CallUsage()
        self.budget_ms = budget_ms  # CPU + IO per call attempt, sub-calls included
        self.code = code
        self.function = function
        self.pending: list[RootCall | list[Any]] = []
        self.next_root = 0
        self.base = 0
        self.added = 0  # root calls the source has given so far
        self.source_done = False
        self.window = window
        self.grown = 0  # root completions since the window last grew
        self.inflight_roots = 0  # dispatched (or waiting for a retry) and not done
        self.done_roots = 0
        # By root index from ``taken``; b"" until the root is done.
        self.outputs: list[bytes] = []
        # Root calls whose outputs were taken (``take_outputs``): outputs[0] is root ``taken``.
        self.taken = 0
        # By root index, only once some root had a context (most tasks have none).
        self.contexts: list[CallContext | None] | None = None
        self.output_bytes = 0
        self.live: set[int] = set()  # every call of the task still in the core
        # Some call of the task has keyword arguments or a context: only then do its
        # batches need those columns.
        self.extras = False
        # Every failed call attempt, up to MAX_CALL_FAILURES, and how many more.
        self.failures: list[CallFailureSummary] = []
        self.failures_omitted = 0
        # Why the adapter cannot resolve the task's function (None: it can).
        self.missing: str | None = None
        # What its calls did while they held executors, and the executors its root
        # calls go to while they keep them busy (``_lanes.py``).
        self.held = HeldTime()
        self.lanes: list[str] = []

    def record_failure(
        self, call: Call, kind: CallFailureKind, message: str, *, retried: bool
    ) -> None:
        """Keep a summary of a failed attempt (the first MAX_CALL_FAILURES only)."""
        if len(self.failures) >= MAX_CALL_FAILURES:
            self.failures_omitted += 1
            return
        self.failures.append(
            CallFailureSummary(
                root_index=call.root_index,
                function=call.function,
                kind=kind,
                message=message[:CALL_FAILURE_MESSAGE_CHARS],
                attempt=call.attempt,
                retried=retried,
            )
        )

    def add(self, roots: list[RootCall | list[Any]]) -> None:
        if self.next_root == len(self.pending):
            self.base += len(self.pending)
            self.pending = roots
            self.next_root = 0
        else:
            self.pending.extend(roots)
        self.added += len(roots)
        self.outputs.extend([b""] * len(roots))

    def undispatched(self) -> int:
        return len(self.pending) - self.next_root

    def converged(self) -> bool:
        return self.source_done and self.done_roots == self.added

    def set_context(self, index: int, context: CallContext) -> None:
        index -= self.taken
        if self.contexts is None:
            self.contexts = [None] * len(self.outputs)
        elif len(self.contexts) < len(self.outputs):
            self.contexts.extend([None] * (len(self.outputs) - len(self.contexts)))
        self.contexts[index] = context

    def tagged_outputs(self) -> RootOutputs:
        contexts = self.contexts
        if contexts is not None:
            contexts.extend([None] * (len(self.outputs) - len(contexts)))
        return RootOutputs(self.outputs, contexts, first=self.taken)

    def take_done(self) -> RootOutputs:
        """The outputs of the root calls done in a row from the first not taken, in
        root order, forgotten here (their bytes no longer count)."""
        outputs = self.outputs
        n = 0
        while n < len(outputs) and outputs[n]:
            n += 1
        values = outputs[:n]
        contexts = None if self.contexts is None else self.contexts[:n]
        if contexts is not None:
            contexts.extend([None] * (n - len(contexts)))
        taken = RootOutputs(values, contexts, first=self.taken)
        del outputs[:n]
        if self.contexts is not None:
            del self.contexts[:n]
        self.taken += n
        self.output_bytes -= sum(len(v) for v in values)
        return taken


class CallState(enum.Enum):
    """Where a call in the core is, between its creation and its end (it completes,
    fails for good or is dropped, and leaves the core from any state)."""

    # Waiting for an executor: new, sent back uncharged by an executor that ended,
    # or its retry is due.
    WAITING = "WAITING"
    # On an executor (``executor_id``): queued, running or suspended there.
    PLACED = "PLACED"
    # A failed attempt's retry waits out its back-off.
    BACKING_OFF = "BACKING_OFF"

    # Every call moves at least twice through CALL_MOVES, keyed by (state, move):
    # members are singletons, equal only to themselves, so hashing them by identity
    # (in C) agrees with their equality; Enum's own __hash__ is Python code.
    __hash__ = object.__hash__


class CallMove(enum.Enum):
    PLACE = "PLACE"  # sent to an executor
    LEAVE = "LEAVE"  # its attempt left the executor: it failed there, or the executor ended
    BACK_OFF = "BACK_OFF"  # the failed attempt is to be retried after a back-off
    RETRY = "RETRY"  # the back-off is over

    __hash__ = object.__hash__  # as CallState's


CALL_MOVES: Final[Mapping[tuple[CallState, CallMove], CallState]] = {
    (CallState.WAITING, CallMove.PLACE): CallState.PLACED,
    (CallState.PLACED, CallMove.LEAVE): CallState.WAITING,
    (CallState.WAITING, CallMove.BACK_OFF): CallState.BACKING_OFF,
    (CallState.BACKING_OFF, CallMove.RETRY): CallState.WAITING,
}


class InvalidCallMove(Exception):
    """A (state, move) pair ``CALL_MOVES`` does not allow: a bug in the dispatcher."""


class Call(msgspec.Struct, eq=False):
    """One call in the core: a root call (``root_index >= 0``) or a sub-call bound to
    its ``parent``. Survives retries; ``state`` says where it is (``CALL_MOVES``), and
    ``executor_id`` is set only while it is PLACED. A Struct (one is made per call,
    in a third of the time a class's ``__init__`` takes); equal only to itself."""

    call_id: int
    task: TaskCalls
    root_index: int  # -1 for a sub-call
    parent: int  # 0 for a root call
    code: str
    function: str
    args: list[Any]
    kwargs: dict[str, Any] | None  # None when the call has none
    context: CallContext | None
    attempt: int = 1
    # This attempt's measured cost: CPU, IO, wall time holding its executor.
    cpu_ns: int = 0
    io_us: int = 0
    held_ms: int = 0
    executor_id: str | None = None
    state: CallState = CallState.WAITING
    children: list[int] | None = None

    def move(self, move: CallMove, *, executor_id: str | None = None) -> None:
        """Move by ``CALL_MOVES`` (to an executor, for PLACE; off it, for LEAVE); an
        illegal pair raises and changes nothing."""
        target = CALL_MOVES.get((self.state, move))
        if target is None:
            raise InvalidCallMove(f"call {self.call_id}: {move.name} while {self.state.name}")
        self.state = target
        if move is CallMove.PLACE:
            self.executor_id = executor_id
        elif move is CallMove.LEAVE:
            self.executor_id = None


class Intake(enum.Enum):
    """Whether an executor takes new calls."""

    ACCEPTING = "ACCEPTING"
    # Takes no new calls; stopped (``RetireExecutor``) once it holds none.
    RETIRING = "RETIRING"


class Executor:
    """One executor as the core sees it.

    ``calls`` are the calls it holds (running, queued or suspended). ``queue`` is
    what it will run, in order: one entry per ExecuteCalls call or ResumeCall sent
    and not yet answered by a frame of that call (the executor runs its messages in
    the order they arrive, so frames come back in this order). ``queue[0]`` holds
    the executor since ``head_since_ms``, when the executor's call-thread CPU clock
    read ``head_cpu_ns`` (and its wait for a CPU, ``head_waited_ns``). ``queued``
    maps each entry to the call it is a sub-call of (0: a root call). A queue entry
    whose call the core let go is an orphan: ``orphaned`` says since when.
    ``alive_ms`` is the last sign of life: a heartbeat, or a sample of its call
    thread's CPU clock that had moved (a call holding the GIL starves the heartbeat
    thread, not the CPU).
    """

    __slots__ = (
        "accounting",
        "alive_ms",
        "calls",
        "cpu_ns",
        "executor_id",
        "head_cpu_ns",
        "head_since_ms",
        "head_waited_ns",
        "orphaned",
        "queue",
        "queued",
        "rss_bytes",
        "running_call",
        "running_us",
        "sampled_ms",
        "started",
        "state",
        "waited_ns",
    )

    def __init__(self, executor_id: str, now_ms: int) -> None:
        self.executor_id = executor_id
        self.calls: set[int] = set()
        self.alive_ms = now_ms
        self.running_call = 0
        self.running_us = 0
        self.queue: deque[int] = deque()
        self.queued: dict[int, int] = {}
        self.orphaned: dict[int, int] = {}
        self.head_since_ms = now_ms
        self.head_cpu_ns: int | None = None
        self.head_waited_ns: int | None = None
        # The last sample of its call thread's CPU clock (None: never sampled), and when;
        # with how long the thread has waited for a CPU in all (None: not known).
        self.cpu_ns: int | None = None
        self.waited_ns: int | None = None
        self.sampled_ms = now_ms
        # REPORTED until its CPU is first sampled from outside: then MEASURED, and
        # the executor's own CPU figures are no longer trusted (``_budget.py``).
        self.accounting = Accounting.REPORTED
        self.started = 0  # calls sent to it, every attempt
        self.state = Intake.ACCEPTING
        self.rss_bytes = 0  # the last sample of its resident memory


def detach(
    calls: dict[int, Call], executors: dict[str, Executor], call_ids: Iterable[int], *, now_ms: int
) -> dict[str, list[int]]:
    """Forget these calls and their sub-calls, transitively; returns, per executor,
    the ids it still holds and must cancel. One still queued or running there
    becomes an orphan (killed with its executor if it keeps running)."""
    cancels: dict[str, list[int]] = defaultdict(list)
    stack = list(call_ids)
    while stack:
        call = calls.pop(stack.pop(), None)
        if call is None:
            continue
        call.task.live.discard(call.call_id)
        if call.executor_id is not None:
            cancels[call.executor_id].append(call.call_id)
            ex = executors.get(call.executor_id)
            if ex is not None:
                ex.calls.discard(call.call_id)
                if call.call_id in ex.queued:
                    ex.orphaned[call.call_id] = now_ms
        if call.children:
            stack.extend(call.children)
    return cancels


def hold_all(ex: Executor, call_ids: list[int], parents: dict[int, int], *, now_ms: int) -> None:
    """An ExecuteCalls' calls go to ``ex``: each (a sub-call of ``parents[call_id]``,
    none when absent) joins its queue, unless it is there already."""
    queue, queued = ex.queue, ex.queued
    for call_id in call_ids:
        if call_id in queued:
            continue
        if not queue:
            ex.head_since_ms = now_ms
            ex.head_cpu_ns = ex.cpu_ns
            ex.head_waited_ns = ex.waited_ns
        queue.append(call_id)
        queued[call_id] = parents.get(call_id, 0) if parents else 0


def hold(ex: Executor, call_id: int, *, now_ms: int, parent: int = 0) -> None:
    """An ExecuteCalls call or a ResumeCall goes to ``ex``: the call (a sub-call of
    ``parent``) joins its queue."""
    hold_all(ex, [call_id], {call_id: parent} if parent else {}, now_ms=now_ms)
