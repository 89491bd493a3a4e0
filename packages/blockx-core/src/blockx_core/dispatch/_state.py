"""The DispatcherCore's records: one per task, per call in the core, per executor."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from blockx_core.calls import CallContext, RootCall, RootOutputs


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
        "function",
        "grown",
        "inflight_roots",
        "live",
        "next_root",
        "output_bytes",
        "outputs",
        "pending",
        "source_done",
        "task_id",
        "window",
    )

    def __init__(self, task_id: str, code: str, function: str, window: int, budget_ms: int) -> None:
        self.task_id = task_id
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
        self.outputs: list[bytes] = []  # by root index; b"" until the root is done
        # By root index, only once some root had a context (most tasks have none).
        self.contexts: list[CallContext | None] | None = None
        self.output_bytes = 0
        self.live: set[int] = set()  # every call of the task still in the core
        # Some call of the task has keyword arguments or a context: only then do its
        # batches need those columns.
        self.extras = False

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
        if self.contexts is None:
            self.contexts = [None] * len(self.outputs)
        elif len(self.contexts) < len(self.outputs):
            self.contexts.extend([None] * (len(self.outputs) - len(self.contexts)))
        self.contexts[index] = context

    def tagged_outputs(self) -> RootOutputs:
        contexts = self.contexts
        if contexts is not None:
            contexts.extend([None] * (len(self.outputs) - len(contexts)))
        return RootOutputs(self.outputs, contexts)


class Call:
    """One call in the core: a root call (``root_index >= 0``) or a sub-call bound to
    its ``parent``. Survives retries; ``executor_id`` is None between attempts."""

    __slots__ = (
        "args",
        "attempt",
        "call_id",
        "children",
        "code",
        "context",
        "executor_id",
        "function",
        "kwargs",
        "parent",
        "retry_due",
        "root_index",
        "task",
    )

    def __init__(
        self,
        call_id: int,
        task: TaskCalls,
        root_index: int,
        parent: int,
        code: str,
        function: str,
        args: list[Any],
        kwargs: dict[str, Any] | None,
        context: CallContext | None,
    ) -> None:
        self.call_id = call_id
        self.task = task
        self.root_index = root_index  # -1 for a sub-call
        self.parent = parent  # 0 for a root call
        self.code = code
        self.function = function
        self.args = args
        self.kwargs = kwargs  # None when the call has none
        self.context = context
        self.attempt = 1
        self.executor_id: str | None = None
        self.retry_due = False
        self.children: list[int] | None = None


class Executor:
    __slots__ = ("calls", "executor_id", "last_heartbeat_ms", "running_call", "running_us")

    def __init__(self, executor_id: str, now_ms: int) -> None:
        self.executor_id = executor_id
        self.calls: set[int] = set()
        self.last_heartbeat_ms = now_ms
        self.running_call = 0
        self.running_us = 0


def detach(
    calls: dict[int, Call], executors: dict[str, Executor], call_ids: Iterable[int]
) -> dict[str, list[int]]:
    """Forget these calls and their sub-calls, transitively; returns, per executor,
    the ids it still holds and must cancel."""
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
        if call.children:
            stack.extend(call.children)
    return cancels
