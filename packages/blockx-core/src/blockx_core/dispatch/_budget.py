"""The call budget: one rule for what the call running on an executor has used of
its CPU + IO budget, and when it is over.

An executor's running call is accounted one of two ways (``Accounting``). Until the
Worker first reads the executor's call-thread CPU clock from the kernel, it has only
the executor's heartbeats: what the executor says the running call has used, as of
its last heartbeat (``REPORTED``). From the first reading on it measures
(``MEASURED``): the kernel's CPU of the call's runs up to the last sample, plus the
IO backend time the Worker charged it, and the executor's own figures only say
which call it is on. The executor checks its calls' budgets too, as a first line
(``blockx_executor.runner``); this is the Worker's rule, the one that kills an
executor.

Everything here is a pure function of the numbers the adapter fed the core.
"""

from __future__ import annotations

import enum
from typing import Final, assert_never

# The soonest a running call's CPU is sampled again near its budget: a call starved
# of CPU at 1 ms from its budget is not sampled every millisecond.
MIN_SAMPLE_GAP_MS: Final = 10


class Accounting(enum.Enum):
    """How the core knows what an executor's running call has used."""

    # The executor's heartbeats: the running call and what it has used so far.
    REPORTED = "REPORTED"
    # The kernel's count of the executor's call-thread CPU, sampled by the Worker.
    MEASURED = "MEASURED"


def used_us(
    accounting: Accounting,
    *,
    measured_us: int,
    reported_us: int,
    reported_ms: int,
    now_ms: int,
) -> int:
    """What the running call has used of its budget this attempt, in µs.

    ``MEASURED``: ``measured_us``, the CPU of its runs as of the last sample plus the
    IO charged to it. ``REPORTED``: ``reported_us``, what the executor said at
    ``reported_ms``, plus its silence since (a call cannot use more CPU than wall
    time)."""
    match accounting:
        case Accounting.MEASURED:
            return measured_us
        case Accounting.REPORTED:
            return reported_us + max(0, now_ms - reported_ms) * 1000
        case _:
            assert_never(accounting)


def over_budget(used: int, budget_us: int) -> bool:
    """The one budget rule: a call over its budget (not at it) has its executor killed
    and fails BUDGET_EXCEEDED."""
    return used > budget_us


def next_sample_ms(*, sampled_ms: int, used: int, budget_us: int) -> int:
    """When a measured call that had used ``used`` µs at ``sampled_ms`` could first be
    over its budget (its CPU cannot run ahead of the wall clock): the adapter samples
    its CPU again then, but not sooner than ``MIN_SAMPLE_GAP_MS``."""
    return sampled_ms + max(MIN_SAMPLE_GAP_MS, (budget_us - used) // 1000 + 1)
