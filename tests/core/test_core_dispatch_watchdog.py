"""DispatcherCore's watchdog: which call holds an executor, the wall limit with its
cancel grace, the CPU budget from samples the adapter measured, the calls' measured
usage, and retiring executors (EXECUTOR_MAX_CALLS, EXECUTOR_MAX_RSS_BYTES).

Time is ``now_ms`` passed in; CPU is ``cpu_ns`` passed in (what the adapter read
from the kernel); nothing sleeps.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsConverged,
    CallsFailed,
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    DispatchConfig,
    DispatcherCore,
    KillExecutor,
    RetireExecutor,
    SendCalls,
)
from blockx_core.dispatch._budget import Accounting, next_sample_ms, over_budget, used_us
from blockx_core.errors import InvalidConfig
from blockx_core.failures import CallFailureKind, FailureCode

CODE = "code@1"
FN = "f"
FAR = 10**12
MS = 1_000_000  # ns

C = TypeVar("C", SendCalls, CancelCalls, KillExecutor, RetireExecutor, CallsFailed)


def make(**fields: Any) -> DispatcherCore:
    base: dict[str, Any] = {
        "executor_heartbeat_timeout_ms": FAR,
        "call_wall_limit_ms": 300,
        "cancel_grace_ms": 100,
        "call_deadline_ms": 1_000,
    }
    return DispatcherCore(DispatchConfig(**(base | fields)))


def of(cmds: Sequence[DispatchCommand], kind: type[C]) -> list[C]:
    return [c for c in cmds if isinstance(c, kind)]


def converges(cmds: Sequence[DispatchCommand]) -> list[ConvergeTaskCalls]:
    return [c for c in cmds if isinstance(c, CallsConverged | CallsFailed)]


def sent(cmds: Sequence[DispatchCommand]) -> list[int]:
    return [i for s in of(cmds, SendCalls) for i in s.call_ids]


def start(core: DispatcherCore, task: str, n: int, now_ms: int = 0) -> list[int]:
    return sent(core.start_task(task, CODE, FN, [[i] for i in range(n)], now_ms))


# ---- the wall limit ----------------------------------------------------------------


def test_a_call_over_the_wall_limit_fails_is_cancelled_then_its_executor_killed() -> None:
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    assert core.next_deadline_ms() == 301
    assert core.tick(300) == []
    out = core.tick(301)
    assert out[0] == CancelCalls(executor_id="e1", call_ids=[call])
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert converged.failure_code is FailureCode.CALL_FAILED
    for part in ("BUDGET_EXCEEDED", "held its executor 301 ms of wall time", "CALL_WALL_LIMIT_MS"):
        assert part in converged.failure_message
    assert not of(out, KillExecutor)
    # Still there after the grace: the executor is killed.
    assert core.next_deadline_ms() == 401
    assert core.tick(400) == []
    [kill] = core.tick(401)
    assert isinstance(kill, KillExecutor)
    assert kill.executor_id == "e1"
    assert core.executor_ids() == []


def test_a_call_that_stops_within_the_grace_keeps_its_executor() -> None:
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    assert converges(core.tick(301))
    # Its late frame arrives: it no longer holds the executor, nothing is killed.
    assert core.calls_completed("e1", [call], [b"1"], 350) == []
    assert core.tick(10_000) == []
    assert core.executor_ids() == ["e1"]


WALL_CASES = [
    # (held before suspending, suspended for, resumed deadline)
    (100, 10_000, 10_100 + 200 + 1),
    (0, 50, 50 + 300 + 1),
    (299, 1, 300 + 1 + 1),
]


@pytest.mark.parametrize(("held", "away", "deadline"), WALL_CASES)
def test_only_time_holding_the_executor_counts(held: int, away: int, deadline: int) -> None:
    """A call suspended on IO holds nothing: its wall time resumes where it was."""
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    core.call_suspended("e1", call, held)
    assert core.tick(held + away) == []
    assert core.call_resuming("e1", call, 0, held + away)
    assert core.next_deadline_ms() == deadline
    assert core.tick(deadline - 1) == []
    assert converges(core.tick(deadline))


def test_a_call_queued_behind_another_starts_its_wall_time_when_that_one_ends() -> None:
    core = make(max_batch_calls=8)
    core.executor_up("e1", 0)
    first, second = start(core, "t", 2)
    assert core.calls_completed("e1", [first], [b"0"], 250) == []
    # The second has held the executor since 250, not since it was sent.
    assert core.tick(549) == []
    assert core.next_deadline_ms() == 551
    assert of(core.tick(551), CancelCalls) == [CancelCalls(executor_id="e1", call_ids=[second])]


def test_the_executors_word_on_its_running_call_moves_the_head_forward() -> None:
    """Completions still buffered in the executor: its heartbeat names the call it is
    on, so the wall time is charged to that one, not to a finished one."""
    core = make()
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    _, second = start(core, "t", 2)
    assert core.executor_heartbeat("e1", second, 0, 200) == []
    out = core.tick(501)
    # The second fails; the first (its completion still on the way) goes with its task.
    assert of(out, CancelCalls)[0] == CancelCalls(executor_id="e1", call_ids=[second])
    assert "#1" in of(out, CallsFailed)[0].failure_message
    # A heartbeat never moves it back.
    core2 = make()
    core2.executor_up("e1", 0)
    core2.executor_sample("e1", 0, cpu_ns=0)
    a, b = start(core2, "t", 2)
    core2.calls_completed("e1", [a], [b"0"], 100)
    assert core2.executor_heartbeat("e1", a, 0, 150) == []
    assert of(core2.tick(401), CancelCalls) == [CancelCalls(executor_id="e1", call_ids=[b])]


def test_a_call_of_an_ended_task_still_holding_its_executor_is_killed_after_the_grace() -> None:
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    assert core.cancel_task("t", 50) == [CancelCalls(executor_id="e1", call_ids=[call])]
    assert core.next_deadline_ms() == 150
    assert core.tick(149) == []
    [kill] = core.tick(150)
    assert isinstance(kill, KillExecutor)


def test_other_calls_on_an_executor_killed_for_a_call_are_retried_uncharged() -> None:
    # One attempt per call: a call charged for its neighbour's kill would fail.
    core = make(max_batch_calls=8, retry=CallRetryPolicy(max_attempts=1))
    core.executor_up("e1", 0)
    [a] = start(core, "a", 1)
    [b] = start(core, "b", 1)
    assert converges(core.tick(301))[0].task_id == "a"
    out = core.tick(401)
    assert of(out, KillExecutor)
    assert core.has_task("b")
    assert not converges(out)
    assert sent(core.executor_up("e2", 401)) == [b]
    assert isinstance(converges(core.calls_completed("e2", [b], [b"1"], 402))[0], CallsConverged)
    assert a != b


# ---- CPU, measured from outside -----------------------------------------------------


CPU_CASES = [
    # (budget_ms, cpu at the sample, io_us charged, killed)
    (1_000, 1_000 * MS, 0, False),  # exactly on budget
    (1_000, 1_000 * MS + 1_000, 0, True),
    (1_000, 600 * MS, 400_000, False),
    (1_000, 600 * MS, 400_001, True),  # CPU + IO
    (200, 201 * MS, 0, True),
]


@pytest.mark.parametrize(("budget", "cpu_ns", "io_us", "killed"), CPU_CASES)
def test_the_cpu_budget_uses_the_samples_not_the_executors_word(
    budget: int, cpu_ns: int, io_us: int, killed: bool
) -> None:
    core = make(call_deadline_ms=budget, call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    assert core.executor_sample("e1", 0, cpu_ns=5 * MS) == []
    [call] = sent(core.start_task("t", CODE, FN, [[0]], 0, budget_ms=budget))
    if io_us:
        core.call_suspended("e1", call, 1)
        assert core.call_resuming("e1", call, io_us, 2)
    # The executor claims to be idle and to have used nothing: that changes nothing.
    assert core.executor_heartbeat("e1", 0, 0, 3) == []
    out = core.executor_sample("e1", 10, cpu_ns=5 * MS + cpu_ns)
    if killed:
        assert out[0] == KillExecutor(
            executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=call
        )
        [converged] = converges(out)
        assert isinstance(converged, CallsFailed)
        assert "BUDGET_EXCEEDED" in converged.failure_message
    else:
        assert out == []


def test_a_measured_executor_ignores_the_running_us_it_reports() -> None:
    core = make(call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    [call] = start(core, "t", 1)
    assert core.executor_heartbeat("e1", call, 10**12, 5) == []


def test_usage_is_what_was_measured() -> None:
    core = make(call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=100 * MS)
    [call] = start(core, "t", 1, now_ms=10)
    usage = core.usage("t")
    core.executor_sample("e1", 40, cpu_ns=107 * MS)
    core.call_suspended("e1", call, 40)
    assert core.call_resuming("e1", call, 2_500, 1_000)
    core.executor_sample("e1", 1_020, cpu_ns=110 * MS)
    [converged] = converges(core.calls_completed("e1", [call], [b"1"], 1_020))
    assert isinstance(converged, CallsConverged)
    assert usage.cpu_ns == 10 * MS
    assert usage.io_us == 2_500
    assert usage.held_ms == 30 + 20  # 10..40 and 1000..1020; the IO wait is not held


def test_a_frame_of_many_results_shares_its_segment_among_them() -> None:
    """One frame ends a run of calls queued on one executor: the CPU and wall time
    measured since the head started are split evenly among them, and the task's usage
    is their sum; the calls of one ExecuteCalls are queued in order, the next one
    then holds the executor."""
    core = make(call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    calls = start(core, "t", 4, now_ms=10)
    usage = core.usage("t")
    assert core.holding_call("e1") == calls[0]
    core.executor_sample("e1", 50, cpu_ns=40 * MS)
    out = core.calls_completed("e1", calls[:3], [b"1", b"2", b"3"], 50)
    assert not converges(out)
    assert core.holding_call("e1") == calls[3]
    assert usage.cpu_ns == 3 * (40 * MS // 3)
    assert usage.held_ms == 3 * (40 // 3)
    core.executor_sample("e1", 70, cpu_ns=48 * MS)
    [converged] = converges(core.calls_completed("e1", calls[3:], [b"4"], 70))
    assert isinstance(converged, CallsConverged)
    assert usage.cpu_ns == 3 * (40 * MS // 3) + 8 * MS
    assert usage.held_ms == 3 * (40 // 3) + 20


def test_a_killed_call_keeps_the_cpu_it_was_measured_using() -> None:
    core = make(call_wall_limit_ms=FAR, call_deadline_ms=100)
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    start(core, "t", 1)
    usage = core.usage("t")
    assert of(core.executor_sample("e1", 150, cpu_ns=150 * MS), KillExecutor)
    assert usage.cpu_ns == 150 * MS
    assert usage.held_ms == 150


# ---- retiring executors ----------------------------------------------------------------


def test_an_executor_is_retired_after_max_calls_and_its_calls_finish_first() -> None:
    core = make(executor_max_calls=3, call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    out = core.start_task("t", CODE, FN, [[i] for i in range(5)], 0)
    first = sent(out)
    assert len(first) == 3  # never more than its EXECUTOR_MAX_CALLS
    assert core.executor_retiring("e1")
    assert core.calls_completed("e1", first[:2], [b"0", b"1"], 1) == []
    out = core.calls_completed("e1", first[2:], [b"2"], 2)
    assert out == [
        RetireExecutor(executor_id="e1", reason="it has run 3 calls (EXECUTOR_MAX_CALLS)")
    ]
    assert core.executor_ids() == []
    # Its replacement takes the rest; no call failed.
    rest = sent(core.executor_up("e2", 3))
    assert len(rest) == 2
    [converged] = converges(core.calls_completed("e2", rest, [b"3", b"4"], 4))
    assert isinstance(converged, CallsConverged)
    assert [o.value_json for o in converged.outputs] == [b"0", b"1", b"2", b"3", b"4"]


RSS_CASES = [
    # (rss at the sample, running a call at the sample, retired)
    (2_000, False, True),
    (1_000, False, False),
    (2_000, True, False),  # what a running call allocates does not count
]


@pytest.mark.parametrize(("rss", "running", "retired"), RSS_CASES)
def test_an_executor_over_the_rss_limit_between_calls_is_retired(
    rss: int, running: bool, retired: bool
) -> None:
    core = make(executor_max_rss_bytes=1_000, call_wall_limit_ms=FAR)
    core.executor_up("e1", 0)
    calls = start(core, "t", 1) if running else []
    out = core.executor_sample("e1", 5, cpu_ns=None, rss_bytes=rss)
    assert core.executor_retiring("e1") is (retired and running)
    if retired:
        assert out == [
            RetireExecutor(
                executor_id="e1",
                reason=f"its resident memory is {rss} bytes between calls, over "
                "EXECUTOR_MAX_RSS_BYTES (1000)",
            )
        ]
    else:
        assert out == []
    if running:
        # After the call, the last sample says the memory stayed: retired then.
        out = core.calls_completed("e1", calls, [b"0"], 10)
        assert of(out, RetireExecutor) == [
            RetireExecutor(
                executor_id="e1",
                reason="its resident memory is 2000 bytes between calls, over "
                "EXECUTOR_MAX_RSS_BYTES (1000)",
            )
        ]


@pytest.mark.parametrize(
    "field",
    ["call_wall_limit_ms", "cancel_grace_ms", "executor_max_calls", "executor_max_rss_bytes"],
)
def test_watchdog_settings_must_be_positive(field: str) -> None:
    fields: dict[str, Any] = {field: 0}
    with pytest.raises(InvalidConfig):
        DispatchConfig(**fields).validate()


def test_the_wall_limit_defaults_to_three_call_deadlines() -> None:
    assert DispatchConfig(call_deadline_ms=700).wall_limit_ms == 2_100
    assert DispatchConfig(call_deadline_ms=700, call_wall_limit_ms=5).wall_limit_ms == 5


@settings(max_examples=200, deadline=None)
@given(
    max_calls=st.integers(1, 6),
    executors=st.integers(1, 3),
    n=st.integers(0, 30),
    batch=st.integers(1, 5),
)
def test_recycling_loses_no_call_and_overfills_no_executor(
    max_calls: int, executors: int, n: int, batch: int
) -> None:
    """Run a task to the end, completing every call sent and replacing every
    executor retired: it succeeds with every output in order, and no executor was
    sent more than ``max_calls`` calls."""
    core = make(executor_max_calls=max_calls, max_batch_calls=batch, call_wall_limit_ms=FAR)
    generation = 0
    per_executor: Counter[str] = Counter()
    outstanding: dict[int, tuple[str, int]] = {}  # call id -> (executor, root)
    pending: deque[DispatchCommand] = deque()
    for _ in range(executors):
        generation += 1
        pending += core.executor_up(f"e{generation}", 0)
    pending += core.start_task("t", CODE, FN, [[i] for i in range(n)], 0)
    converged: list[ConvergeTaskCalls] = []
    now = 0
    while not converged:
        now += 1
        while pending:
            cmd = pending.popleft()
            if isinstance(cmd, SendCalls):
                per_executor[cmd.executor_id] += len(cmd.call_ids)
                for call_id, args in zip(cmd.call_ids, cmd.args, strict=True):
                    outstanding[call_id] = (cmd.executor_id, args[0])
            elif isinstance(cmd, RetireExecutor):
                assert all(e != cmd.executor_id for e, _ in outstanding.values())
                generation += 1
                pending += core.executor_up(f"e{generation}", now)
            elif isinstance(cmd, ConvergeTaskCalls):
                converged.append(cmd)
            else:
                raise AssertionError(f"unexpected {cmd}")
        if converged:
            break
        assert outstanding, "calls are waiting but none is on an executor"
        call_id, (executor, root) = next(iter(outstanding.items()))
        del outstanding[call_id]
        pending += core.calls_completed(executor, [call_id], [str(root).encode()], now)
    [done] = converged
    assert isinstance(done, CallsConverged)
    assert [o.value_json for o in done.outputs] == [str(i).encode() for i in range(n)]
    assert all(count <= max_calls for count in per_executor.values())


# ---- signs of life and the one budget rule ----------------------------------------------

LIFE_CASES = [
    # (CPU of the call at each sample (ms) every 100 ms from 100 on, heartbeats after 0?,
    #  what the tick at 401 does)
    ([100, 200, 300, 400], False, "alive"),  # holding the GIL: no heartbeat, CPU moves
    ([100, 100, 100, 100], False, "lost"),  # nothing moves: hung
    ([0, 0, 0, 0], True, "alive"),  # waiting in a system call, heartbeats go on
    ([100, 200, 300, 1_001], False, "budget"),
]


@pytest.mark.parametrize(("cpu_ms", "beats", "outcome"), LIFE_CASES)
def test_a_silent_executor_is_lost_only_when_its_cpu_stands_still(
    cpu_ms: list[int], beats: bool, outcome: str
) -> None:
    core = make(
        call_wall_limit_ms=FAR,
        executor_heartbeat_timeout_ms=300,
        retry=CallRetryPolicy(max_attempts=1),
    )
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    [call] = start(core, "t", 1)
    out: list[DispatchCommand] = []
    for i, cpu in enumerate(cpu_ms):
        now = 100 * (i + 1)
        out += core.executor_sample("e1", now, cpu_ns=cpu * MS)
        if beats:
            out += core.executor_heartbeat("e1", call, 0, now)
    out += core.tick(401)
    kills = of(out, KillExecutor)
    if outcome == "alive":
        assert out == []
        assert core.holding_call("e1") == call
        return
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert converged.failed_call is not None
    if outcome == "lost":
        assert kills == [
            KillExecutor(executor_id="e1", reason="no heartbeat and no CPU progress for 301 ms")
        ]
        assert converged.failed_call.kind is CallFailureKind.EXECUTOR_LOST
    else:
        assert kills == [
            KillExecutor(
                executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=call
            )
        ]
        assert converged.failed_call.kind is CallFailureKind.BUDGET_EXCEEDED
        assert converged.failed_call.attempts == 1


def test_the_core_asks_for_a_sample_when_the_call_could_reach_its_budget() -> None:
    core = make(call_wall_limit_ms=FAR, executor_heartbeat_timeout_ms=FAR)
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    [call] = start(core, "t", 1)
    # 200 ms used of 1000 at 100: the CPU cannot pass the budget before 100 + 800.
    assert core.executor_sample("e1", 100, cpu_ns=200 * MS) == []
    assert core.next_deadline_ms() == 901
    assert core.executor_sample("e1", 901, cpu_ns=995 * MS) == []
    assert core.next_deadline_ms() == 901 + 10  # never more often than every 10 ms
    out = core.executor_sample("e1", 911, cpu_ns=1_005 * MS)
    assert out[0] == KillExecutor(
        executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=call
    )
    assert core.next_deadline_ms() is None


@settings(max_examples=300, deadline=None)
@example(steps=[(301, 0, True)])  # a heartbeat due at the very millisecond of the kill
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 400), st.sampled_from([0, 1, 2]), st.booleans()),
        min_size=1,
        max_size=30,
    )
)
def test_the_cpu_decides_the_budget_and_a_sign_of_life(
    steps: list[tuple[int, int, bool]],
) -> None:
    """A call whose CPU runs at 0, half or full speed for random stretches, with or
    without a heartbeat at the end of each, driven as the adapter does (a sample
    before each heartbeat, and a sample then a tick whenever the core's deadline
    falls due). The executor is killed for the budget only when the CPU is over it,
    and within 11 ms of passing it; it is declared lost only when neither a
    heartbeat nor its CPU moved for the timeout, and by 2 x timeout + 3 ms of both
    standing still."""
    budget, timeout = 1_000, 300
    core = make(
        call_deadline_ms=budget, call_wall_limit_ms=FAR, executor_heartbeat_timeout_ms=timeout
    )
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    [call] = start(core, "t", 1)
    times, cpus, beats = [0], [0], set()
    for dt, rate, beat in steps:
        times.append(times[-1] + dt)
        cpus.append(cpus[-1] + dt * MS * rate // 2)
        if beat:
            beats.add(times[-1])

    def cpu_at(t: int) -> int:
        for i in range(1, len(times)):
            if t <= times[i]:
                lo, hi = times[i - 1], times[i]
                return cpus[i - 1] + (cpus[i] - cpus[i - 1]) * (t - lo) // (hi - lo)
        return cpus[-1]

    killed: tuple[int, KillExecutor] | None = None
    for end in times[1:]:
        while killed is None and (due := core.next_deadline_ms()) is not None and due <= end:
            out = core.executor_sample("e1", due, cpu_ns=cpu_at(due)) + core.tick(due)
            killed = next(((due, k) for k in of(out, KillExecutor)), None)
        if killed is not None:
            break
        out = core.executor_sample("e1", end, cpu_ns=cpu_at(end))
        if end in beats:
            out += core.executor_heartbeat("e1", call, 0, end)
        killed = next(((end, k) for k in of(out, KillExecutor)), None)
        if killed is not None:
            break

    crossed = next((t for t in range(times[-1] + 1) if cpu_at(t) > budget * MS), None)
    still = next(
        (
            t
            for t in range(2 * timeout + 3, times[-1] + 1)
            if cpu_at(t) == cpu_at(t - 2 * timeout - 3)
            and not any(t - 2 * timeout - 3 < b <= t for b in beats)
        ),
        None,
    )
    if killed is None:
        assert crossed is None or crossed + 11 > times[-1]
        assert still is None
        return
    at, kill = killed
    if kill.over_budget_call_id is not None:
        assert kill == KillExecutor(
            executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=call
        )
        assert cpu_at(at) > budget * MS
        assert crossed is not None
        assert at <= crossed + 11
    else:
        assert kill.reason.startswith("no heartbeat and no CPU progress")
        assert cpu_at(at) == cpu_at(at - timeout - 1)
        # A heartbeat at the very millisecond of the kill comes after it (the test
        # serves the deadline first, as an adapter may).
        assert not any(at - timeout - 1 < b < at for b in beats)
        assert crossed is None or at < crossed + 11
    assert still is None or at <= still


# ---- who pays when an executor ends --------------------------------------------------


def test_a_sub_call_over_its_budget_charges_the_parent_awaiting_it_there() -> None:
    """The parent's run died with the executor: it is charged (a parent that keeps
    calling a sub-call that kills its executor ends), unlike the call of another
    task queued behind, which goes again uncharged."""
    core = make(call_wall_limit_ms=FAR, max_batch_calls=8, retry=CallRetryPolicy(max_attempts=1))
    core.executor_up("e1", 0)
    core.executor_sample("e1", 0, cpu_ns=0)
    [parent] = start(core, "a", 1)
    core.call_suspended("e1", parent, 0)
    [child] = sent(core.subcall_requested("e1", parent, CODE, "g", [], 1))
    [neighbour] = start(core, "b", 1)
    core.executor_up("e2", 1)
    out = core.executor_sample("e1", 1_100, cpu_ns=1_050 * MS)
    assert out[0] == KillExecutor(
        executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=child
    )
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert converged.task_id == "a"
    assert converged.failed_call is not None
    assert converged.failed_call.kind is CallFailureKind.EXECUTOR_LOST
    assert sent(out) == [neighbour]
    assert converges(core.calls_completed("e2", [neighbour], [b"1"], 1_101))


def test_a_parent_queued_behind_its_stuck_child_is_charged_when_the_executor_is_killed() -> None:
    """The child fails at the wall limit and its parent, on the same executor, is
    resumed with that failure; the child ignores its cancel and the executor is
    killed: the parent is charged, so a parent that calls it again and again ends."""
    core = make(call_wall_limit_ms=300, cancel_grace_ms=100, retry=CallRetryPolicy(max_attempts=1))
    core.executor_up("e1", 0)
    [parent] = start(core, "a", 1)
    core.call_suspended("e1", parent, 0)
    [child] = sent(core.subcall_requested("e1", parent, CODE, "g", [], 0))
    out = core.tick(301)
    assert CancelCalls(executor_id="e1", call_ids=[child]) in out
    assert core.holding_call("e1") == child
    out = core.tick(401)
    assert of(out, KillExecutor)
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert converged.failed_call is not None
    assert converged.failed_call.kind is CallFailureKind.EXECUTOR_LOST


# ---- a call the Worker could not send ------------------------------------------------


def test_a_call_that_could_not_be_sent_fails_alone_and_holds_nothing() -> None:
    core = make(call_wall_limit_ms=300, max_batch_calls=8)
    core.executor_up("e1", 0)
    [a] = start(core, "a", 1)
    [b] = start(core, "b", 1, now_ms=50)
    out = core.call_unsent("e1", a, CallFailureKind.BAD_ARGUMENTS, "no msgpack type", 60)
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert converged.task_id == "a"
    assert converged.failed_call is not None
    failed = converged.failed_call
    assert (failed.kind, failed.attempts, failed.retryable) == (
        CallFailureKind.BAD_ARGUMENTS,
        1,
        False,
    )
    # b holds the executor from now: its wall time starts at 60, not at 0.
    assert core.holding_call("e1") == b
    assert core.next_deadline_ms() == 60 + 300 + 1
    assert core.call_unsent("e1", a, CallFailureKind.BAD_ARGUMENTS, "again", 61) == []


# ---- the budget rule, as a pure function ---------------------------------------------


# (accounting, measured_us, reported_us, reported_ms, now_ms, used_us): measured, the
# kernel's figure alone; reported, the executor's figure plus its silence since.
USED_CASES = [
    (Accounting.MEASURED, 700, 0, 0, 0, 700),
    (Accounting.MEASURED, 700, 9_000, 0, 50, 700),
    (Accounting.REPORTED, 9_999, 400, 10, 10, 400),
    (Accounting.REPORTED, 0, 400, 10, 13, 3_400),
    (Accounting.REPORTED, 0, 400, 10, 5, 400),  # a clock behind the report adds nothing
]


@pytest.mark.parametrize(
    ("accounting", "measured_us", "reported_us", "reported_ms", "now_ms", "expected"), USED_CASES
)
def test_what_a_running_call_has_used_follows_its_executors_accounting(
    accounting: Accounting,
    measured_us: int,
    reported_us: int,
    reported_ms: int,
    now_ms: int,
    expected: int,
) -> None:
    used = used_us(
        accounting,
        measured_us=measured_us,
        reported_us=reported_us,
        reported_ms=reported_ms,
        now_ms=now_ms,
    )
    assert used == expected


def test_every_accounting_has_a_rule() -> None:
    assert {case[0] for case in USED_CASES} == set(Accounting)


@pytest.mark.parametrize(("used", "over"), [(999, False), (1_000, False), (1_001, True)])
def test_a_call_is_over_its_budget_only_past_it(used: int, over: bool) -> None:
    assert over_budget(used, 1_000) is over


@pytest.mark.parametrize(
    ("used", "due"), [(0, 100 + 1_001), (995_000, 100 + 10), (1_000_000, 100 + 10)]
)
def test_the_next_sample_is_when_the_budget_could_first_be_passed(used: int, due: int) -> None:
    assert next_sample_ms(sampled_ms=100, used=used, budget_us=1_000_000) == due


def test_an_executor_is_measured_from_its_first_cpu_sample_on() -> None:
    # Reported: its own figure is what the call used (1 s budget).
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    assert of(core.executor_heartbeat("e1", call, 1_000_001, 0), KillExecutor)
    # Measured: the same figure only says which call runs; the kernel says 1 ms.
    core = make()
    core.executor_up("e1", 0)
    [call] = start(core, "t", 1)
    assert core.executor_sample("e1", 0, cpu_ns=0) == []
    assert core.executor_heartbeat("e1", call, 1_000_001, 0) == []
    assert core.executor_sample("e1", 11, cpu_ns=1 * MS) == []
