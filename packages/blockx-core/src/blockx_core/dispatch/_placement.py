"""Where new calls go: water-filling over the executors' loads."""

from __future__ import annotations

from collections.abc import Iterable

from blockx_core.dispatch._state import Executor


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
