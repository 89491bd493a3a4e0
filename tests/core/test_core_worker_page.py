"""What the Worker page reads, without a Worker: the dispatcher's view of each
executor (the call on its CPU and for how long, its queue, a cancelled call still
stopping), the calls waiting by what they wait for, and the load series' points.

Time is ``now_ms`` passed in; nothing sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest

from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsWaiting,
    DispatchConfig,
    DispatcherCore,
    ExecutorState,
    RunningCall,
    SendCalls,
)
from blockx_core.errors import InvalidConfig
from blockx_core.failures import CallFailureKind
from blockx_core.load_series import LoadPoint, LoadSeries, LoadTotals

CODE = "code@1"


def make(**fields: Any) -> DispatcherCore:
    base: dict[str, Any] = {
        "executor_heartbeat_timeout_ms": 10**12,
        "call_wall_limit_ms": 10**9,
        "initial_window": 2,
        "task_max_inflight_calls": 2,
        "retry": CallRetryPolicy(
            max_attempts=2, backoff_ms=50, retry_on=frozenset({CallFailureKind.USER_ERROR})
        ),
    }
    return DispatcherCore(DispatchConfig(**(base | fields)))


def sent(cmds: Any) -> dict[str, list[int]]:
    by_executor: dict[str, list[int]] = {}
    for c in cmds:
        if isinstance(c, SendCalls):
            by_executor.setdefault(c.executor_id, []).extend(c.call_ids)
    return by_executor


def test_an_executor_shows_the_call_on_its_cpu_and_for_how_long() -> None:
    core = make()
    core.executor_up("e1", 0)
    [[first, second]] = sent(core.start_task("t", CODE, "slow", [[1], [2], [3]], 100)).values()
    [view] = core.executor_states(12_100)
    assert view == ExecutorState(
        executor_id="e1",
        running=RunningCall(
            call_id=first, task_id="t", function="slow", root_index=0, attempt=1, held_ms=12_000
        ),
        calls_queued=1,
        calls_suspended=0,
        calls_started=2,
        rss_bytes=0,
        retiring=False,
    )
    assert core.calls_waiting() == CallsWaiting(
        queued_on_executors=1, no_executor=0, retry_backoff=0, roots_not_dispatched=1
    )
    # The first suspends on IO: the second runs, the first is held but off the CPU.
    core.call_suspended("e1", first, 12_500)
    [view] = core.executor_states(13_000)
    assert view.running is not None
    assert (view.running.call_id, view.running.held_ms) == (second, 500)
    assert (view.calls_queued, view.calls_suspended) == (0, 1)


def test_an_idle_executor_and_a_cancelled_call_still_stopping() -> None:
    core = make()
    core.executor_up("e1", 0)
    core.executor_up("e2", 0)
    calls = sent(core.start_task("t", CODE, "slow", [[1]], 0))
    [busy] = calls
    core.cancel_task("t", 1_000)
    views = {v.executor_id: v for v in core.executor_states(1_400)}
    assert views[busy].running == RunningCall(
        call_id=calls[busy][0],
        task_id="",
        function="",
        root_index=-1,
        attempt=0,
        held_ms=400,
        cancelled=True,
    )
    [idle] = {"e1", "e2"} - {busy}
    assert views[idle].running is None


def test_calls_with_no_executor_or_in_a_retry_back_off_are_waiting() -> None:
    core = make()
    core.start_task("t", CODE, "f", [[1]], 0)
    assert core.calls_waiting().no_executor == 1
    [[call]] = sent(core.executor_up("e1", 10)).values()
    assert core.calls_waiting() == CallsWaiting(
        queued_on_executors=0, no_executor=0, retry_backoff=0, roots_not_dispatched=0
    )
    core.call_failed("e1", call, CallFailureKind.USER_ERROR, "boom", 20)
    assert core.calls_waiting().retry_backoff == 1
    assert core.executor_states(30)[0].running is None


# ---- the load series ---------------------------------------------------------------------


def test_each_point_is_what_happened_in_its_interval() -> None:
    series = LoadSeries(0, interval_ms=10_000, max_points=3)
    assert series.next_sample_ms() == 10_000
    series.sample(10_000, LoadTotals(calls_finished=500, tasks_failed=1), slots_peak=4)
    # A late sample (a busy loop) makes a longer interval, not a wrong rate.
    series.sample(25_000, LoadTotals(calls_finished=650, tasks_failed=1), slots_peak=2)
    assert series.next_sample_ms() == 35_000
    points = series.points(30_000, LoadTotals(calls_finished=700, tasks_failed=3), slots_peak=1)
    assert points == (
        LoadPoint(start_ms=0, end_ms=10_000, slots_peak=4, calls_finished=500, tasks_failed=1),
        LoadPoint(start_ms=10_000, end_ms=25_000, slots_peak=2, calls_finished=150, tasks_failed=0),
        LoadPoint(start_ms=25_000, end_ms=30_000, slots_peak=1, calls_finished=50, tasks_failed=2),
    )
    assert [p.calls_per_s for p in points] == [50.0, 10.0, 10.0]


def test_the_series_keeps_its_last_points_only() -> None:
    series = LoadSeries(0, interval_ms=1, max_points=3)
    for t in range(1, 100):
        series.sample(t, LoadTotals(calls_finished=t), slots_peak=t)
    points = series.points(100, LoadTotals(calls_finished=100), slots_peak=0)
    assert [p.end_ms for p in points] == [97, 98, 99, 100]  # three closed, one in progress


@pytest.mark.parametrize(("field", "value"), [("interval_ms", 0), ("max_points", 0)])
def test_a_series_needs_an_interval_and_a_point(field: str, value: int) -> None:
    with pytest.raises(InvalidConfig) as refused:
        LoadSeries(0, **{field: value})
    assert refused.value.field == field
