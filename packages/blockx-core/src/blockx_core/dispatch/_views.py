"""What the dispatcher is doing now, read-only: each executor's running call and
queue, and the calls waiting for an executor. Built on demand (the Worker page),
never kept; nothing here changes the dispatcher."""

from __future__ import annotations

import msgspec

from blockx_core.dispatch._state import Call, CallState, Executor, Intake, TaskCalls


class RunningCall(msgspec.Struct, frozen=True, kw_only=True):
    """The call on an executor's CPU now. ``held_ms``: how long this attempt has held
    the executor (what CALL_WALL_LIMIT_MS bounds). ``cancelled``: the dispatcher let
    it go (its task ended, or it passed the wall limit) and it has not stopped yet;
    its task and function are no longer known then."""

    call_id: int
    task_id: str
    function: str
    root_index: int  # -1 for a sub-call
    attempt: int
    held_ms: int
    cancelled: bool = False


class ExecutorState(msgspec.Struct, frozen=True, kw_only=True):
    """One executor process of a Worker; ``running`` is None when it is idle. The
    dispatcher knows no process ids: the Worker, which started the process, sets
    ``pid`` (0: not known, it is being replaced)."""

    executor_id: str
    pid: int = 0
    running: RunningCall | None  # None: idle
    calls_queued: int  # calls sent to it, waiting behind the running one
    calls_suspended: int  # calls it holds that wait on IO or a sub-call
    calls_started: int  # calls sent to it since it came up, every attempt
    rss_bytes: int  # its resident memory at its last heartbeat
    retiring: bool = False  # takes no new calls; replaced once idle

    @property
    def busy(self) -> bool:
        return self.running is not None


class CallsWaiting(msgspec.Struct, frozen=True, kw_only=True):
    """Calls not on any executor's CPU: queued behind a running call, with no
    executor to go to, waiting out a retry's back-off, and root calls a task's
    window holds back."""

    queued_on_executors: int = 0
    no_executor: int = 0
    retry_backoff: int = 0
    roots_not_dispatched: int = 0

    @property
    def total(self) -> int:
        return (
            self.queued_on_executors
            + self.no_executor
            + self.retry_backoff
            + self.roots_not_dispatched
        )


def executor_state(ex: Executor, calls: dict[int, Call], now_ms: int) -> ExecutorState:
    running: RunningCall | None = None
    if ex.queue:
        head = ex.queue[0]
        call = calls.get(head)
        since = ex.head_since_ms
        if call is not None and call.executor_id == ex.executor_id:
            running = RunningCall(
                call_id=head,
                task_id=call.task.task_id,
                function=call.function,
                root_index=call.root_index,
                attempt=call.attempt,
                held_ms=call.held_ms + max(0, now_ms - since),
            )
        else:
            since = max(since, ex.orphaned.get(head, since))
            running = RunningCall(
                call_id=head,
                task_id="",
                function="",
                root_index=-1,
                attempt=0,
                held_ms=max(0, now_ms - since),
                cancelled=True,
            )
    in_queue = sum(1 for call_id in ex.queue if call_id in ex.calls)
    return ExecutorState(
        executor_id=ex.executor_id,
        running=running,
        calls_queued=max(0, len(ex.queue) - 1),
        calls_suspended=max(0, len(ex.calls) - in_queue),
        calls_started=ex.started,
        rss_bytes=ex.rss_bytes,
        retiring=ex.state is Intake.RETIRING,
    )


def calls_waiting(
    executors: dict[str, Executor],
    calls: dict[int, Call],
    unassigned: list[Call],
    retries: list[tuple[int, int]],
    tasks: dict[str, TaskCalls],
) -> CallsWaiting:
    backoff = len(
        {
            call_id
            for _, call_id in retries
            if (c := calls.get(call_id)) and c.state is CallState.BACKING_OFF
        }
    )
    return CallsWaiting(
        queued_on_executors=sum(max(0, len(ex.queue) - 1) for ex in executors.values()),
        no_executor=sum(1 for c in unassigned if c.call_id in calls),
        retry_backoff=backoff,
        roots_not_dispatched=sum(task.undispatched() for task in tasks.values()),
    )
