"""ListTasks: the tasks a Worker holds, in the order it first saw them, filtered, paged.

A ``TaskDirectory`` records, per task id, what a listing shows beyond the task's
state: when the Worker first saw it (reserved or submitted), its Call Builder and
root function, when it converged. The state itself, the result and whether only a
tombstone is left are asked of the slot table and the retention at listing time
(``lookup``), so the directory never disagrees with them.

Invariants:

* every task the Worker holds (a slot in use, a retained result, a tombstone) has
  an entry, and its ``(seq, task_id)`` is in ``_order``;
* ``_order`` is sorted by ``seq``, which only grows (entries are appended);
* an entry whose task is no longer held is dropped lazily: when a listing passes
  it, or when ``_order`` has grown past twice its length after the last rebuild
  (plus 1,024): a rebuild costs O(n) once per n new tasks, O(1) amortized, and
  ``_order`` never holds much more than twice the tasks held at that rebuild.

A page costs O(log n) to find its start (a bisect on the token's ``seq``), then one
lookup per entry it looks at, at most ``SCAN_BUDGET`` of them, whatever the filters
match and whatever ``task_slots`` is. A page that used up its budget answers what
it found with a token to go on from.

Failed tasks outlive their results (``FailedHistory``). A result is answered for
RESULT_RETENTION_MS, then forgotten: GetTaskResult says NOT_FOUND and the task id
may run again, as the specification says. An operator looking for the failure of
an hour ago still needs to find it, so the directory keeps a summary of each of the
Worker's last ``failed_tasks_kept`` failed tasks, made when the task converged:
what a listing shows of it (failure code, the first ``FAILURE_SUMMARY_CHARS`` of its
message, retryability, function, times, call counts), never its outputs. While the
task is held it is listed as before; once it is not, a query with
``include_expired`` lists its summary in its place, marked ``expired``. A summary
is keyed by the ``seq`` of the run it summarises, so a task id that runs again
keeps the summary of its earlier run, and ``_order`` keeps every ``seq`` that has
one. The summaries live in memory: a restart loses them.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from blockx_core.failures import FailureCode
from blockx_core.ids import shown
from blockx_core.task import TaskResult, TaskState
from blockx_core.worker._progress import CallProgress
from blockx_core.worker._types import TaskPhase, TaskSnapshot

MAX_PAGE_SIZE: Final = 10_000
DEFAULT_PAGE_SIZE: Final = 1_000
# Entries one page looks at, matching the filters or not.
SCAN_BUDGET: Final = 50_000
# A listed failure keeps this much of its message.
FAILURE_SUMMARY_CHARS: Final = 200
# A failed task's summary kept after it expired keeps this much of its function and
# Call Builder names, so FAILED_TASKS_KEPT bounds the memory (about 1 KB each).
EXPIRED_NAME_CHARS: Final = 256

# How far past twice its last rebuilt length ``_order`` grows before the next rebuild.
_REBUILD_SLACK: Final = 1024

# The states a Worker holds tasks in (NOT_FOUND is what a client reads for none).
HELD_STATES: Final = frozenset(
    {TaskState.ALLOCATED, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED}
)

Lookup = Callable[[str, int], TaskSnapshot | None]


class ListTasksQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Empty ``states`` and ``function`` match every task; an age bound of 0 is none.
    ``min_age_ms``: first seen at least that long ago; ``max_age_ms``: at most."""

    states: frozenset[TaskState] = frozenset()
    function: str = ""
    min_age_ms: int = 0
    max_age_ms: int = 0
    page_size: int = 0  # 0: DEFAULT_PAGE_SIZE
    page_token: str = ""
    # Also the summaries of failed tasks no longer held (their retention ended).
    include_expired: bool = False


class ListedTask(msgspec.Struct, frozen=True, kw_only=True):
    """A task as a Worker's ListTasks shows it: ``created_ms`` is when that Worker
    first saw it (reserved or submitted), ``converged_ms`` when it ended (0 while
    not terminal); ``tombstone`` says only its outcome is kept, not its outputs;
    ``call_failures`` counts the failed call attempts its result records;
    ``expired``: a failed task whose result has expired, of which the Worker keeps
    only this summary (GetTaskResult answers NOT_FOUND, the id may run again).
    Clients read the same type."""

    task_id: str
    state: TaskState
    # The Worker that holds it, as a client listing several Workers names it; a
    # Worker's own listing leaves it empty (its answer names the Worker once).
    worker_addr: str = ""
    slot_id: str = ""
    call_builder: str = ""
    function: str = ""
    created_ms: int = 0
    converged_ms: int = 0  # 0 while not terminal
    # The chain its Builder config names; "" when it names none.
    chain: str = ""
    failure_code: FailureCode | None = None
    failure_summary: str = ""
    # Only a tombstone is left: the outputs were dropped for the retention budget.
    tombstone: bool = False
    # Failed call attempts the result keeps (plus the ones it only counts).
    call_failures: int = 0
    # The task's call progress as last counted (running) or at its end; all 0
    # before its Calls phase.
    calls_done: int = 0
    calls_total: int = 0
    calls_total_known: bool = False
    # A failed task: whether resubmitting the same work may succeed.
    retryable: bool = False
    # Only its summary is left (see FailedHistory): the Worker no longer holds it.
    expired: bool = False

    @property
    def progress(self) -> CallProgress | None:
        """The counts as a CallProgress; None for a task that has made no calls."""
        if not self.calls_total and not self.calls_done:
            return None
        return CallProgress(
            calls_done=self.calls_done,
            calls_total=self.calls_total,
            total_known=self.calls_total_known,
        )


class RunningTask(msgspec.Struct, frozen=True, kw_only=True):
    """A submitted task that has not converged: as a listing shows it, with the phase
    it is in (PREPARING to WRITER) and when it times out."""

    task: ListedTask
    phase: TaskPhase
    deadline_ms: int


class TaskListing(msgspec.Struct, frozen=True, kw_only=True):
    tasks: tuple[ListedTask, ...]
    # Empty when the listing reached the end.
    next_page_token: str = ""


class _Entry:
    __slots__ = (
        "call_builder",
        "chain",
        "converged_ms",
        "created_ms",
        "function",
        "progress",
        "seq",
    )

    def __init__(self, seq: int, created_ms: int) -> None:
        self.seq = seq
        self.created_ms = created_ms
        self.call_builder = ""
        self.function = ""
        self.chain = ""
        self.converged_ms = 0
        self.progress: CallProgress | None = None


def query_problem(query: ListTasksQuery) -> str | None:
    """What is wrong with ``query``, said so a caller can fix it; None when valid."""
    odd = query.states - HELD_STATES
    if odd:
        shown = ", ".join(sorted(s.value for s in odd))
        return (
            f"states: a worker holds no task in {shown}; use ALLOCATED, RUNNING, SUCCEEDED, FAILED"
        )
    if query.min_age_ms < 0 or query.max_age_ms < 0:
        return (
            f"min_age_ms and max_age_ms must be >= 0 (got {query.min_age_ms}, "
            f"{query.max_age_ms}); 0 means no bound"
        )
    if query.max_age_ms and query.min_age_ms > query.max_age_ms:
        return (
            f"min_age_ms {query.min_age_ms} > max_age_ms {query.max_age_ms}: "
            "no task can be both that old and that new"
        )
    if not 0 <= query.page_size <= MAX_PAGE_SIZE:
        return (
            f"page_size must be 0 (the default, {DEFAULT_PAGE_SIZE}) to {MAX_PAGE_SIZE} "
            f"(got {query.page_size}); page on with next_page_token"
        )
    return None


class FailedHistory:
    """The summaries of the last ``kept`` failed tasks by ``seq``, the oldest (in the
    order they converged) forgotten first (see the module docstring)."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._by_seq: OrderedDict[int, ListedTask] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_seq)

    def __contains__(self, seq: int) -> bool:
        return seq in self._by_seq

    def record(self, seq: int, summary: ListedTask) -> None:
        if not self._kept:
            return
        self._by_seq[seq] = summary
        while len(self._by_seq) > self._kept:
            self._by_seq.popitem(last=False)

    def get(self, seq: int) -> ListedTask | None:
        return self._by_seq.get(seq)

    def newest(self) -> Iterator[tuple[int, ListedTask]]:
        """``(seq, summary)``, the last failure first."""
        return reversed(self._by_seq.items())


class TaskDirectory:
    """See the module docstring. ``incarnation`` ties page tokens to this run;
    ``failed_tasks_kept`` bounds the summaries of failed tasks."""

    def __init__(self, incarnation: str, failed_tasks_kept: int = 0) -> None:
        self._incarnation = incarnation
        self._entries: dict[str, _Entry] = {}
        self._order: list[tuple[int, str]] = []
        self._next_seq = 1
        self._rebuild_at = _REBUILD_SLACK
        self._failed = FailedHistory(failed_tasks_kept)

    def seen(self, task_id: str, now_ms: int, lookup: Lookup) -> None:
        """A slot was reserved for ``task_id``."""
        entry = _Entry(self._next_seq, now_ms)
        self._next_seq += 1
        self._entries[task_id] = entry
        self._order.append((entry.seq, task_id))
        if len(self._order) > self._rebuild_at:
            self._rebuild(now_ms, lookup)

    def submitted(self, task_id: str, call_builder: str, function: str, chain: str = "") -> None:
        entry = self._entries.get(task_id)
        if entry is not None:
            entry.call_builder = call_builder
            entry.function = function
            entry.chain = chain

    def counted(self, task_id: str, progress: CallProgress) -> None:
        entry = self._entries.get(task_id)
        if entry is not None:
            entry.progress = progress

    def progress(self, task_id: str) -> CallProgress | None:
        entry = self._entries.get(task_id)
        return None if entry is None else entry.progress

    def converged(self, task_id: str, result: TaskResult, now_ms: int) -> None:
        """The task ended with ``result``; a failure's summary is kept (FailedHistory)."""
        entry = self._entries.get(task_id)
        if entry is None:
            return
        entry.converged_ms = now_ms
        if not result.success:
            summary = _listed(task_id, entry, TaskState.FAILED, "", result, expired=True)
            self._failed.record(entry.seq, summary)

    def listed(self, task_id: str, now_ms: int, lookup: Lookup) -> ListedTask | None:
        """The task's latest run as a listing shows it, while it is held."""
        entry = self._entries.get(task_id)
        return None if entry is None else self._held(entry.seq, task_id, now_ms, lookup)

    def recent_failures(self, limit: int, now_ms: int, lookup: Lookup) -> list[ListedTask]:
        """The last ``limit`` failed tasks, newest first: held ones as a listing shows
        them, the others' summaries marked ``expired``. O(limit)."""
        found: list[ListedTask] = []
        for seq, summary in self._failed.newest():
            if len(found) >= limit:
                break
            found.append(self._held(seq, summary.task_id, now_ms, lookup) or summary)
        return found

    def page(self, query: ListTasksQuery, now_ms: int, lookup: Lookup) -> TaskListing | str:
        """One page of the tasks ``query`` matches, or what is wrong with its token."""
        after = self._token_seq(query.page_token)
        if isinstance(after, str):
            return after
        size = query.page_size or DEFAULT_PAGE_SIZE
        oldest_ms = now_ms - query.max_age_ms if query.max_age_ms else None
        newest_ms = now_ms - query.min_age_ms
        found: list[ListedTask] = []
        position = bisect.bisect_right(self._order, (after, "\U0010ffff"))
        scanned = 0
        last_seq = after
        order = self._order
        while position < len(order) and len(found) < size and scanned < SCAN_BUDGET:
            seq, task_id = order[position]
            position += 1
            scanned += 1
            last_seq = seq
            entry = self._entries.get(task_id)
            if entry is not None and entry.seq == seq:
                if not _matches(query, entry.function, entry.created_ms, oldest_ms, newest_ms):
                    continue
                snapshot = lookup(task_id, now_ms)
                if snapshot is not None:
                    if not query.states or snapshot.state in query.states:
                        found.append(_listed_snapshot(task_id, entry, snapshot))
                    continue
                del self._entries[task_id]  # no longer held; _order is rebuilt later
            # Not held (any more), or an earlier run of a task id that came back.
            summary = self._failed.get(seq) if query.include_expired else None
            if (
                summary is not None
                and (not query.states or TaskState.FAILED in query.states)
                and _matches(query, summary.function, summary.created_ms, oldest_ms, newest_ms)
            ):
                found.append(summary)
        more = position < len(order)
        token = f"{self._incarnation}:{last_seq}" if more else ""
        return TaskListing(tasks=tuple(found), next_page_token=token)

    def _token_seq(self, token: str) -> int | str:
        if not token:
            return 0
        incarnation, _, seq = token.rpartition(":")
        if incarnation != self._incarnation:
            return (
                f"page_token {shown(token)} is not from this run of the worker (it restarted, "
                "or the token was made up): list again without a page_token"
            )
        if not seq.isdigit():
            return (
                f"page_token {shown(token)} is not a token this worker gave: pass next_page_token"
            )
        return int(seq)

    def _held(self, seq: int, task_id: str, now_ms: int, lookup: Lookup) -> ListedTask | None:
        """The run ``seq`` of ``task_id`` as a listing shows it, while it is held."""
        entry = self._entries.get(task_id)
        if entry is None or entry.seq != seq:
            return None
        snapshot = lookup(task_id, now_ms)
        return None if snapshot is None else _listed_snapshot(task_id, entry, snapshot)

    def _rebuild(self, now_ms: int, lookup: Lookup) -> None:
        kept: list[tuple[int, str]] = []
        for seq, task_id in self._order:
            entry = self._entries.get(task_id)
            if entry is not None and entry.seq == seq and lookup(task_id, now_ms) is None:
                del self._entries[task_id]
                entry = None
            held = entry is not None and entry.seq == seq
            if held or seq in self._failed:
                kept.append((seq, task_id))
        self._order = kept
        self._rebuild_at = 2 * len(kept) + _REBUILD_SLACK


def _matches(
    query: ListTasksQuery, function: str, created_ms: int, oldest_ms: int | None, newest_ms: int
) -> bool:
    """The function and age filters (the state is asked of the task itself)."""
    if query.function and function != query.function:
        return False
    return created_ms <= newest_ms and (oldest_ms is None or created_ms >= oldest_ms)


def _listed_snapshot(task_id: str, entry: _Entry, snapshot: TaskSnapshot) -> ListedTask:
    return _listed(
        task_id,
        entry,
        snapshot.state,
        snapshot.slot_id,
        snapshot.result,
        tombstone=snapshot.outputs_dropped,
    )


def _listed(
    task_id: str,
    entry: _Entry,
    state: TaskState,
    slot_id: str,
    result: TaskResult | None,
    *,
    tombstone: bool = False,
    expired: bool = False,
) -> ListedTask:
    progress = entry.progress or CallProgress()
    # A summary outlives its task: it keeps bounded names (they come from clients).
    bound = EXPIRED_NAME_CHARS if expired else None
    return ListedTask(
        task_id=task_id,
        state=state,
        slot_id=slot_id,
        call_builder=entry.call_builder[:bound],
        function=entry.function[:bound],
        chain=entry.chain[:bound],
        created_ms=entry.created_ms,
        converged_ms=entry.converged_ms if state.is_terminal else 0,
        failure_code=None if result is None else result.failure_code,
        failure_summary="" if result is None else result.failure_message[:FAILURE_SUMMARY_CHARS],
        call_failures=0
        if result is None
        else len(result.call_failures) + result.call_failures_omitted,
        calls_done=progress.calls_done,
        calls_total=progress.calls_total,
        calls_total_known=progress.total_known,
        tombstone=tombstone,
        retryable=result is not None and not result.success and result.retryable,
        expired=expired,
    )
