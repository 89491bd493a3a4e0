"""CPU lanes: how many executors a task's calls spread over.

More executors than CPUs only help calls that block while they hold an executor
(a plain ``def`` that sleeps or reads a slow file): for calls that keep a CPU
busy, the executors beyond the CPUs take turns on them, and every switch costs
the calls' caches. So a task whose calls keep their executors busy sends its root
calls to ``cpu_lanes`` executors (its lanes, kept from one placement to the next),
and a task whose calls block, or that has not shown yet what its calls do,
spreads them over every executor.

What the calls do is measured, not guessed: while a call holds an executor, the
kernel splits that wall time into time on a CPU, time runnable but waiting for one
(``run_delay``: other processes had the CPUs) and the rest, blocked. A task is
CPU-bound once its calls have held executors for ``EVIDENCE_US`` and were blocked
less than half of it. The sums halve whenever they pass ``MEMORY_US``, so a task
whose calls change their ways is judged by what they did lately.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Held time before a task's calls are judged; then what they did lately counts.
EVIDENCE_US: Final = 20_000
MEMORY_US: Final = 2_000_000


class HeldTime:
    """How long one task's calls held executors, and how much of it they were blocked."""

    __slots__ = ("blocked_us", "held_us")

    def __init__(self) -> None:
        self.held_us = 0
        self.blocked_us = 0

    def add(self, *, held_us: int, busy_us: int) -> None:
        """A stretch of ``held_us`` of which ``busy_us`` was on a CPU or waiting for one."""
        self.held_us += held_us
        self.blocked_us += max(0, held_us - busy_us)
        while self.held_us > MEMORY_US:
            self.held_us //= 2
            self.blocked_us //= 2

    @property
    def cpu_bound(self) -> bool:
        return self.held_us >= EVIDENCE_US and 2 * self.blocked_us < self.held_us


def lanes(kept: list[str], loads: Mapping[str, int], count: int) -> list[str]:
    """The ``count`` executors a CPU-bound task's calls go to: those of ``kept``
    still taking calls (``loads``: each one's calls held), then the least loaded of
    the others."""
    chosen = [i for i in kept[:count] if i in loads]
    if len(chosen) < count:
        others = sorted((i for i in loads if i not in chosen), key=loads.__getitem__)
        chosen += others[: count - len(chosen)]
    return chosen
