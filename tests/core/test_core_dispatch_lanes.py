"""CPU lanes: a task whose calls keep their executors busy sends its root calls to
``cpu_lanes`` executors; one whose calls block, or that has not shown what its
calls do, spreads them over every executor.

What the calls do comes from the samples the adapter reads from the kernel
(``cpu_ns`` on a CPU, ``waited_ns`` runnable and waiting for one), passed in with
``now_ms``; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.dispatch import (
    CallsConverged,
    DispatchCommand,
    DispatchConfig,
    DispatcherCore,
    SendCalls,
)
from blockx_core.dispatch._lanes import EVIDENCE_US, MEMORY_US, HeldTime
from blockx_core.errors import InvalidConfig

CODE = "code@1"
FN = "f"
FAR = 10**12
MS = 1_000_000  # ns
EXECUTORS = ["e1", "e2", "e3", "e4"]


def make(cpu_lanes: int = 2, **fields: Any) -> DispatcherCore:
    config = DispatchConfig(
        executor_heartbeat_timeout_ms=FAR,
        call_deadline_ms=FAR // 10,
        cpu_lanes=cpu_lanes,
        initial_window=64,
        task_max_inflight_calls=64,
        **fields,
    )
    core = DispatcherCore(config)
    for executor_id in EXECUTORS:
        core.executor_up(executor_id, 0)
        core.executor_sample(executor_id, 0, cpu_ns=0, waited_ns=0)
    return core


def placed(cmds: Sequence[DispatchCommand]) -> dict[str, list[int]]:
    """The call ids each executor was sent."""
    out: dict[str, list[int]] = {}
    for cmd in cmds:
        if isinstance(cmd, SendCalls):
            out.setdefault(cmd.executor_id, []).extend(cmd.call_ids)
    return out


class Executors:
    """What each executor holds and its kernel clocks, as a test drives them."""

    def __init__(self, core: DispatcherCore) -> None:
        self.core = core
        self.up = list(EXECUTORS)
        self.holds: dict[str, list[int]] = {e: [] for e in EXECUTORS}
        self.cpu = dict.fromkeys(EXECUTORS, 0)
        self.waited = dict.fromkeys(EXECUTORS, 0)

    def take(self, cmds: Sequence[DispatchCommand]) -> dict[str, list[int]]:
        sent = placed(cmds)
        for executor_id, call_ids in sent.items():
            self.holds[executor_id].extend(call_ids)
        return sent

    def finish(
        self, executor_id: str, now_ms: int, *, cpu_ms: int, waited_ms: int = 0
    ) -> dict[str, list[int]]:
        """Everything ``executor_id`` holds ends in one frame, after it spent
        ``cpu_ms`` on a CPU and ``waited_ms`` waiting for one; returns the refill."""
        self.cpu[executor_id] += cpu_ms * MS
        self.waited[executor_id] += waited_ms * MS
        core = self.core
        out = core.executor_sample(
            executor_id,
            now_ms,
            cpu_ns=self.cpu[executor_id],
            waited_ns=self.waited[executor_id],
        )
        call_ids, self.holds[executor_id] = self.holds[executor_id], []
        out += core.calls_completed(executor_id, call_ids, [b"1"] * len(call_ids), now_ms)
        return self.take(out)


def rounds(
    executors: Executors, start_ms: int, count: int, *, cpu_ms: int, waited_ms: int = 0
) -> set[str]:
    """``count`` rounds of 30 ms in which every executor ends what it holds after
    ``cpu_ms`` on a CPU and ``waited_ms`` waiting for one; the executors refilled."""
    reached: set[str] = set()
    for n in range(count):
        for executor_id in executors.up:
            now_ms = start_ms + 30 * n
            reached |= set(
                executors.finish(executor_id, now_ms, cpu_ms=cpu_ms, waited_ms=waited_ms)
            )
    return reached


def started(core: DispatcherCore, task_id: str = "t", n: int = 100_000) -> Executors:
    executors = Executors(core)
    first = executors.take(core.start_task(task_id, CODE, FN, [[i] for i in range(n)], 0))
    assert sorted(first) == EXECUTORS  # nothing known yet: spread over all
    return executors


def test_a_task_whose_calls_keep_a_cpu_busy_narrows_to_its_lanes_and_keeps_them() -> None:
    executors = started(make())
    lanes = rounds(executors, 30, 1, cpu_ms=30)
    assert len(lanes) == 2
    assert rounds(executors, 60, 20, cpu_ms=30) == lanes


def test_calls_that_only_wait_their_turn_for_a_cpu_are_cpu_bound() -> None:
    # Oversubscribed: 8 ms on a CPU and 22 ms runnable, waiting for one, in 30 ms.
    executors = started(make())
    rounds(executors, 30, 1, cpu_ms=8, waited_ms=22)
    assert len(rounds(executors, 60, 20, cpu_ms=8, waited_ms=22)) == 2


def test_a_task_whose_calls_block_spreads_over_every_executor() -> None:
    # 1 ms on a CPU in 30 ms held: the calls sleep (or read a slow file).
    executors = started(make())
    assert rounds(executors, 30, 20, cpu_ms=1) == set(EXECUTORS)


def test_a_task_whose_calls_start_blocking_spreads_again() -> None:
    executors = started(make())
    rounds(executors, 30, 1, cpu_ms=30)
    assert len(rounds(executors, 60, 5, cpu_ms=30)) == 2
    # What they did lately counts: a long stretch of blocked calls spreads the task.
    rounds(executors, 210, 200, cpu_ms=0)
    assert rounds(executors, 6210, 5, cpu_ms=0) == set(EXECUTORS)


def test_a_lane_that_is_lost_is_replaced_by_another_executor() -> None:
    core = make()
    executors = started(core)
    rounds(executors, 30, 1, cpu_ms=30)
    lanes = rounds(executors, 60, 3, cpu_ms=30)
    gone = sorted(lanes)[0]
    executors.take(core.executor_lost(gone, "test", 150))
    executors.up.remove(gone)
    later = rounds(executors, 160, 10, cpu_ms=30)
    assert len(later) == 2
    assert gone not in later
    assert lanes - {gone} < later


def test_a_new_task_is_judged_on_its_own_calls() -> None:
    core = make(cpu_lanes=1)
    executors = started(core, "a")
    [lane] = rounds(executors, 30, 1, cpu_ms=30)
    # Task "a" keeps its one lane busy; "b" has shown nothing yet: it spreads over
    # the three others (one lane would be one executor).
    b = executors.take(core.start_task("b", CODE, FN, [[i] for i in range(64)], 60))
    assert sorted(b) == sorted(set(EXECUTORS) - {lane})


@pytest.mark.parametrize("cpu_lanes", [0, 4, 9])
def test_no_narrowing_when_lanes_are_off_or_as_many_as_the_executors(cpu_lanes: int) -> None:
    executors = started(make(cpu_lanes=cpu_lanes))
    assert rounds(executors, 30, 10, cpu_ms=30) == set(EXECUTORS)


def test_without_the_wait_for_a_cpu_nothing_is_judged() -> None:
    # The fallback clock (the process CPU clock) does not say how long it waited.
    core = make()
    for executor_id in EXECUTORS:
        core.executor_sample(executor_id, 0, cpu_ns=0, waited_ns=None)
    out = core.start_task("t", CODE, FN, [[i] for i in range(2000)], 0)
    holds = placed(out)
    assert sorted(holds) == EXECUTORS
    for n, executor_id in enumerate(["e1", "e3"], start=1):
        now_ms = 30 * n
        core.executor_sample(executor_id, now_ms, cpu_ns=now_ms * MS, waited_ns=None)
        call_ids = holds[executor_id]
        refill = placed(core.calls_completed(executor_id, call_ids, [b"1"] * len(call_ids), now_ms))
        # Spread by load (the emptiest gets calls), not kept to lanes.
        assert executor_id in refill


def test_every_call_still_completes_once_with_lanes() -> None:
    core = make()
    executors = Executors(core)
    executors.take(core.start_task("t", CODE, FN, [[i] for i in range(500)], 0))
    outputs: list[CallsConverged] = []
    now_ms = 0
    while not outputs:
        now_ms += 10
        for executor_id in EXECUTORS:
            executors.cpu[executor_id] += 10 * MS
            cmds = core.executor_sample(
                executor_id, now_ms, cpu_ns=executors.cpu[executor_id], waited_ns=0
            )
            call_ids, executors.holds[executor_id] = executors.holds[executor_id], []
            cmds += core.calls_completed(executor_id, call_ids, [b"7"] * len(call_ids), now_ms)
            executors.take(cmds)
            outputs += [c for c in cmds if isinstance(c, CallsConverged)]
    [converged] = outputs
    assert [(o.index, o.value_json) for o in converged.outputs] == [(i, b"7") for i in range(500)]


def test_cpu_lanes_below_zero_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="cpu_lanes"):
        DispatcherCore(DispatchConfig(cpu_lanes=-1))


# ---- HeldTime ------------------------------------------------------------------------


def test_held_time_needs_evidence_before_it_judges() -> None:
    held = HeldTime()
    held.add(held_us=EVIDENCE_US - 1, busy_us=EVIDENCE_US - 1)
    assert not held.cpu_bound
    held.add(held_us=1, busy_us=1)
    assert held.cpu_bound


@pytest.mark.parametrize(
    ("held_us", "busy_us", "cpu_bound"),
    [
        (30_000, 30_000, True),
        (30_000, 15_001, True),
        (30_000, 15_000, False),  # blocked half the time: it blocks
        (30_000, 0, False),
        (30_000, 45_000, True),  # samples a millisecond apart can say more than held
    ],
)
def test_held_time_judges_by_the_blocked_share(held_us: int, busy_us: int, cpu_bound: bool) -> None:
    held = HeldTime()
    held.add(held_us=held_us, busy_us=busy_us)
    assert held.cpu_bound is cpu_bound


@given(st.lists(st.tuples(st.integers(0, 10 * MEMORY_US), st.integers(0, 20 * MEMORY_US))))
def test_held_time_stays_bounded_and_blocked_within_held(adds: list[tuple[int, int]]) -> None:
    held = HeldTime()
    for held_us, busy_us in adds:
        held.add(held_us=held_us, busy_us=busy_us)
        assert 0 <= held.blocked_us <= held.held_us
        assert held.held_us <= MEMORY_US
