"""Where new calls go: water-filling over the executors' loads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from blockx_core.dispatch._commands import SendCalls
from blockx_core.dispatch._state import CALL_MOVES, Call, CallMove, CallState, Executor

WAITING = CallState.WAITING
PLACED = CallState.PLACED
# place() makes this move inline (a call of ``Call.move`` per placed call cost a
# fifth of the dispatcher's time per call): the table must still say so.
assert CALL_MOVES[(WAITING, CallMove.PLACE)] is PLACED


def place(
    calls: list[Call], executors: dict[str, Executor], max_batch: int, *, one_group: bool = False
) -> list[SendCalls]:
    """Assign calls to executors (at least one is up), spreading by load, in batches
    of one task's one function of at most ``max_batch`` calls; ``one_group`` when
    the caller knows they are all of one task's one function."""
    first = calls[0]
    if one_group or all(
        c.task is first.task and c.code == first.code and c.function == first.function
        for c in calls
    ):
        groups: Iterator[list[Call]] = iter([calls])
    else:
        by_key: dict[tuple[str, str, str], list[Call]] = defaultdict(list)
        for call in calls:
            by_key[(call.task.task_id, call.code, call.function)].append(call)
        groups = iter(by_key.values())
    out: list[SendCalls] = []
    for group in groups:
        head = group[0]
        budget_ms = head.task.budget_ms
        # Columns for keyword arguments and contexts only when some call has them.
        extras = head.task.extras
        with_kwargs = extras and any(c.kwargs is not None for c in group)
        with_contexts = extras and any(c.context is not None for c in group)
        offset = 0
        for ex, share in water_fill(executors.values(), len(group)):
            ex_id = ex.executor_id
            ex_calls = ex.calls
            for lo in range(offset, offset + share, max_batch):
                batch = group[lo : min(lo + max_batch, offset + share)]
                call_ids = [c.call_id for c in batch]
                for call in batch:
                    if call.state is not WAITING:
                        call.move(CallMove.PLACE, executor_id=ex_id)  # raises: not allowed
                    call.state = PLACED
                    call.executor_id = ex_id
                ex_calls.update(call_ids)
                out.append(
                    SendCalls(
                        executor_id=ex_id,
                        task_id=head.task.task_id,
                        code=head.code,
                        function=head.function,
                        budget_ms=budget_ms,
                        call_ids=call_ids,
                        args=[c.args for c in batch],
                        kwargs=[c.kwargs or {} for c in batch] if with_kwargs else None,
                        contexts=[c.context for c in batch] if with_contexts else None,
                    )
                )
            offset += share
    return out


def water_fill(executors: Iterable[Executor], n: int) -> list[tuple[Executor, int]]:
    """Split ``n`` new calls so that executor loads end as even as possible.

    The lowest-loaded executors are raised together until the next one's load is
    reached, then that one joins them; what remains is spread evenly over the
    level group (the first ones take the remainder). O(e log e) for e executors.
    """
    exs = sorted(executors, key=lambda e: len(e.calls))
    loads = [len(e.calls) for e in exs]
    count = len(exs)
    level = loads[0]
    width = 1
    remaining = n
    while True:
        while width < count and loads[width] <= level:
            width += 1
        if width == count:
            break
        room = (loads[width] - level) * width
        if room >= remaining:
            break
        remaining -= room
        level = loads[width]
    per, extra = divmod(remaining, width)
    shares = []
    for i in range(width):
        share = level - loads[i] + per + (1 if i < extra else 0)
        if share > 0:
            shares.append((exs[i], share))
    return shares
