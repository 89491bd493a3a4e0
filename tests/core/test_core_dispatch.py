"""DispatcherCore: the sans-IO engine of the Calls phase (windows, retries, sub-calls).

Every test drives the core through its public events with explicit ``now_ms``
integers and asserts on the commands it returns; nothing sleeps or reads a
clock. Call ids are never hard-coded: they are read back from the ``SendCalls``
the core emits. Root calls carry ``[root_index]`` (or ``[root_index, ...]``) as
their arguments so that a ``SendCalls`` says which root each id is.

The random-interleaving property test lives in test_core_dispatch_property.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import pytest

from blockx_core.calls import CallContext, RootCall, RootOutput
from blockx_core.dispatch import (
    AbortCall,
    CallFailure,
    CallRetryPolicy,
    CallsConverged,
    CallsFailed,
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    DispatchConfig,
    DispatcherCore,
    KillExecutor,
    ResumeWithIo,
    ResumeWithResult,
    SendCalls,
    SubCallFailed,
    SubCallReturned,
)
from blockx_core.errors import BlockxUsageError, InvalidConfig
from blockx_core.failures import CallFailureKind, Failure, FailureCode, IoErrorKind, is_retryable

CODE = "code@1"
FN = "score_block"
# Heartbeat timeouts far away, for tests that are not about them.
NO_HB = 10**12

C = TypeVar("C", SendCalls, CancelCalls, ResumeWithResult, KillExecutor)


# The wall limit and the cancel grace are off unless a test is about them (the tests
# written before them advance time freely with calls in flight).
NO_WATCH: dict[str, Any] = {"call_wall_limit_ms": NO_HB, "cancel_grace_ms": NO_HB}


def make(**fields: Any) -> DispatcherCore:
    return DispatcherCore(DispatchConfig(**(NO_WATCH | fields)))


def of(cmds: Sequence[DispatchCommand], kind: type[C]) -> list[C]:
    return [c for c in cmds if isinstance(c, kind)]


def up(core: DispatcherCore, *executors: str, now_ms: int = 0) -> None:
    for ex in executors:
        assert core.executor_up(ex, now_ms) == []


def placement(cmds: Sequence[DispatchCommand]) -> dict[int, str]:
    """Call id -> the executor a SendCalls put it on."""
    where: dict[int, str] = {}
    for s in of(cmds, SendCalls):
        for cid in s.call_ids:
            assert cid not in where, f"call {cid} sent twice in one step"
            where[cid] = s.executor_id
    return where


def root_ids(cmds: Sequence[DispatchCommand]) -> dict[int, int]:
    """Root index (the first argument) -> call id."""
    ids: dict[int, int] = {}
    for s in of(cmds, SendCalls):
        for cid, args in zip(s.call_ids, s.args, strict=True):
            ids[args[0]] = cid
    return ids


def roots(n: int) -> list[list[Any]]:
    return [[i] for i in range(n)]


def tagged(values: list[bytes]) -> list[RootOutput]:
    """Outputs in root order, as the core tags them (no context)."""
    return [RootOutput(i, value) for i, value in enumerate(values)]


def values(converge: ConvergeTaskCalls) -> list[bytes]:
    """The outputs' values (none for a failed phase)."""
    outputs = converge.outputs if isinstance(converge, CallsConverged) else ()
    return [o.value_json for o in outputs]


def result(i: int) -> bytes:
    return f'"r{i}"'.encode()


def cancelled(cmds: Sequence[DispatchCommand]) -> set[tuple[str, int]]:
    return {(c.executor_id, cid) for c in of(cmds, CancelCalls) for cid in c.call_ids}


def converges(cmds: Sequence[DispatchCommand]) -> list[ConvergeTaskCalls]:
    return [c for c in cmds if isinstance(c, CallsConverged | CallsFailed)]


def only_converge(cmds: Sequence[DispatchCommand]) -> ConvergeTaskCalls:
    found = converges(cmds)
    assert len(found) == 1, cmds
    return found[0]


def only_failure(cmds: Sequence[DispatchCommand]) -> CallsFailed:
    converge = only_converge(cmds)
    assert isinstance(converge, CallsFailed), converge
    return converge


# ---- configuration ----------------------------------------------------------------------

BAD_CONFIGS = [
    # (fields, offending field)
    ({"task_max_inflight_calls": 0}, "task_max_inflight_calls"),
    ({"initial_window": 0}, "initial_window"),
    ({"call_deadline_ms": 0}, "call_deadline_ms"),
    ({"max_collected_output_bytes": 0}, "max_collected_output_bytes"),
    ({"executor_heartbeat_timeout_ms": 0}, "executor_heartbeat_timeout_ms"),
    ({"max_batch_calls": 0}, "max_batch_calls"),
    ({"retry": CallRetryPolicy(max_attempts=0)}, "max_attempts"),
    ({"retry": CallRetryPolicy(backoff_ms=-1, backoff_max_ms=0)}, "backoff_ms"),
    ({"retry": CallRetryPolicy(backoff_ms=100, backoff_max_ms=99)}, "backoff_max_ms"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_CONFIGS)
def test_invalid_config_is_rejected(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        make(**fields)
    assert err.value.field == field


BACKOFF_CASES = [
    # (backoff_ms, backoff_max_ms, failed_attempt, expected delay)
    (100, 2_000, 1, 100),
    (100, 2_000, 2, 200),
    (100, 2_000, 3, 400),
    (100, 2_000, 5, 1_600),
    (100, 2_000, 6, 2_000),
    (100, 2_000, 1_000, 2_000),
    (7, 1_000, 4, 56),
    (0, 0, 9, 0),
]


@pytest.mark.parametrize(("base", "cap", "attempt", "expected"), BACKOFF_CASES)
def test_backoff_doubles_and_is_capped(base: int, cap: int, attempt: int, expected: int) -> None:
    policy = CallRetryPolicy(backoff_ms=base, backoff_max_ms=cap)
    assert policy.backoff_for(attempt) == expected


def test_default_policy_retries_only_executor_lost() -> None:
    assert CallRetryPolicy().retry_on == frozenset({CallFailureKind.EXECUTOR_LOST})


# ---- start_task / executor_up --------------------------------------------------------------


@pytest.mark.parametrize("executors", [(), ("e1",)])
def test_empty_call_list_converges_at_once(executors: tuple[str, ...]) -> None:
    core = make()
    up(core, *executors)
    assert core.start_task("t1", CODE, FN, [], 0) == [
        CallsConverged(task_id="t1", outputs=tagged([]))
    ]
    assert not core.has_task("t1")
    assert core.live_calls() == 0


def test_duplicate_task_id_raises_and_changes_nothing() -> None:
    core = make()
    up(core, "e1")
    first = core.start_task("t1", CODE, FN, roots(2), 0)
    assert len(placement(first)) == 2
    with pytest.raises(BlockxUsageError):
        core.start_task("t1", CODE, FN, roots(5), 0)
    assert core.live_calls() == 2
    assert core.executor_load("e1") == 2


def test_a_converged_task_id_can_start_again() -> None:
    core = make()
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    assert isinstance(
        only_converge(core.calls_completed("e1", [ids[0]], [result(0)], 1)), CallsConverged
    )
    assert len(placement(core.start_task("t1", CODE, FN, roots(1), 2))) == 1


def test_executor_up_twice_raises() -> None:
    core = make()
    up(core, "e1")
    with pytest.raises(BlockxUsageError):
        core.executor_up("e1", 1)
    assert core.executor_ids() == ["e1"]
    # Once lost, the same id may come up again (a restarted process).
    assert core.executor_lost("e1", "exited", 2) == []
    up(core, "e1", now_ms=3)
    assert core.executor_ids() == ["e1"]


# ---- dispatch ----------------------------------------------------------------------------


def test_calls_wait_for_an_executor_and_go_out_when_one_comes_up() -> None:
    core = make(call_deadline_ms=1_234)
    args = [[0, "a", {"k": 1}], [1, "b", None]]
    assert core.start_task("t1", CODE, FN, args, 0) == []
    assert core.live_calls() == 2
    cmds = core.executor_up("e1", 10)
    [send] = of(cmds, SendCalls)
    assert cmds == [send]
    assert send == SendCalls(
        executor_id="e1",
        task_id="t1",
        code=CODE,
        function=FN,
        budget_ms=1_234,
        call_ids=send.call_ids,
        args=args,
    )
    assert len(set(send.call_ids)) == 2
    assert all(core.call_task(cid) == "t1" for cid in send.call_ids)
    assert all(core.call_code(cid) == CODE for cid in send.call_ids)
    # Nothing is left waiting: a second executor gets nothing.
    assert core.executor_up("e2", 11) == []


BATCH_CASES = [
    # (calls, max_batch_calls, executors, expected batch sizes per executor)
    (10, 3, 1, {"e0": [3, 3, 3, 1]}),
    (10, 5, 2, {"e0": [5], "e1": [5]}),
    (11, 5, 2, {"e0": [5, 1], "e1": [5]}),
    (7, 1, 3, {"e0": [1, 1, 1], "e1": [1, 1], "e2": [1, 1]}),
    (4, 512, 3, {"e0": [2], "e1": [1], "e2": [1]}),
    (1, 1, 1, {"e0": [1]}),
]


@pytest.mark.parametrize(("n", "max_batch", "n_exec", "expected"), BATCH_CASES)
def test_batches_never_exceed_max_batch_calls(
    n: int, max_batch: int, n_exec: int, expected: dict[str, list[int]]
) -> None:
    core = make(max_batch_calls=max_batch)
    up(core, *(f"e{i}" for i in range(n_exec)))
    cmds = core.start_task("t1", CODE, FN, roots(n), 0)
    sends = of(cmds, SendCalls)
    assert all(len(s.call_ids) <= max_batch for s in sends)
    assert all(len(s.call_ids) == len(s.args) for s in sends)
    sizes: dict[str, list[int]] = {}
    for s in sends:
        sizes.setdefault(s.executor_id, []).append(len(s.call_ids))
    assert {ex: sorted(v, reverse=True) for ex, v in sizes.items()} == expected
    # Every root goes out exactly once, with its own arguments.
    assert sorted(root_ids(cmds)) == list(range(n))
    assert len(placement(cmds)) == n


WATER_FILL_CASES = [
    # (loads before, new calls, loads after (sorted))
    ([0], 5, [5]),
    ([0, 0], 1, [0, 1]),
    ([0, 0, 0], 7, [2, 2, 3]),
    ([5, 0, 0], 4, [2, 2, 5]),
    ([5, 0, 0], 12, [5, 6, 6]),
    ([4, 1], 2, [3, 4]),
    ([4, 1], 3, [4, 4]),
    ([4, 1], 5, [5, 5]),
    ([3, 3, 0], 1, [1, 3, 3]),
    ([3, 3, 0], 3, [3, 3, 3]),
    ([3, 3, 0], 4, [3, 3, 4]),
    ([3, 3, 0], 7, [4, 4, 5]),
    ([9, 2, 2, 1], 6, [3, 4, 4, 9]),
    ([9, 2, 2, 1], 30, [11, 11, 11, 11]),
    ([6, 6, 6], 2, [6, 7, 7]),
]


def loaded_core(loads: list[int], **fields: Any) -> DispatcherCore:
    """Executors e0.. with these loads: each comes up in turn (heaviest first) and a
    filler task of its load lands on it alone, being the emptiest."""
    core = make(**fields)
    order = sorted(range(len(loads)), key=lambda i: -loads[i])
    for i in order:
        up(core, f"e{i}")
        if loads[i]:
            cmds = core.start_task(f"fill{i}", CODE, FN, roots(loads[i]), 0)
            assert set(placement(cmds).values()) == {f"e{i}"}
    assert [core.executor_load(f"e{i}") for i in range(len(loads))] == loads
    return core


@pytest.mark.parametrize(("loads", "n", "after"), WATER_FILL_CASES)
def test_calls_spread_by_load_water_filling(loads: list[int], n: int, after: list[int]) -> None:
    core = loaded_core(loads)
    cmds = core.start_task("t1", CODE, FN, roots(n), 0)
    received = Counter(placement(cmds).values())
    final = [loads[i] + received[f"e{i}"] for i in range(len(loads))]
    assert sorted(final) == after
    assert [core.executor_load(f"e{i}") for i in range(len(loads))] == final
    # Whoever received calls ends at most one above the least-loaded executor.
    receivers = [final[i] for i in range(len(loads)) if received[f"e{i}"]]
    assert max(receivers) - min(final) <= 1


INITIAL_WINDOW_CASES = [
    # (initial_window, task_max_inflight_calls, roots, sent at start)
    (64, 1_024, 100, 64),
    (64, 10, 100, 10),
    (4, 4, 3, 3),
    (1, 1, 5, 1),
    (8, 16, 8, 8),
]


@pytest.mark.parametrize(("initial", "limit", "n", "expected"), INITIAL_WINDOW_CASES)
def test_initial_window(initial: int, limit: int, n: int, expected: int) -> None:
    core = make(initial_window=initial, task_max_inflight_calls=limit)
    up(core, "e1")
    cmds = core.start_task("t1", CODE, FN, roots(n), 0)
    assert sorted(root_ids(cmds)) == list(range(expected))
    assert core.task_window("t1") == min(initial, limit)
    assert core.task_inflight("t1") == expected


WINDOW_GROWTH_CASES = [
    # (initial_window, task_max_inflight_calls, roots, [(completions so far, window)])
    (2, 9, 40, [(0, 2), (1, 2), (2, 4), (5, 4), (6, 8), (13, 8), (14, 9), (39, 9)]),
    (1, 1, 5, [(0, 1), (1, 1), (4, 1)]),
    (3, 10, 30, [(0, 3), (2, 3), (3, 6), (8, 6), (9, 10), (29, 10)]),
    (4, 64, 20, [(0, 4), (3, 4), (4, 8), (11, 8), (12, 16), (19, 16)]),
]


@pytest.mark.parametrize(("initial", "limit", "n", "windows"), WINDOW_GROWTH_CASES)
def test_window_doubles_after_a_window_of_completions_up_to_the_limit(
    initial: int, limit: int, n: int, windows: list[tuple[int, int]]
) -> None:
    core = make(initial_window=initial, task_max_inflight_calls=limit)
    up(core, "e1")
    expected = dict(windows)
    outstanding = root_ids(core.start_task("t1", CODE, FN, roots(n), 0))
    assert len(outstanding) == min(initial, limit)
    last: list[DispatchCommand] = []
    for done in range(n):
        if done in expected:
            assert core.task_window("t1") == expected[done], f"after {done} completions"
        window = core.task_window("t1")
        assert window <= limit
        assert len(outstanding) == core.task_inflight("t1") == min(window, n - done)
        # Complete the lowest root in flight, one at a time.
        index = min(outstanding)
        last = core.calls_completed("e1", [outstanding.pop(index)], [result(index)], done + 1)
        new = root_ids(last)
        assert not set(new) & set(outstanding)
        outstanding.update(new)
    assert values(only_converge(last)) == [result(i) for i in range(n)]
    assert not outstanding


# ---- calls_completed -----------------------------------------------------------------------

ORDER_CASES = [
    # completion batches, by root index
    [[0], [1], [2], [3]],
    [[3], [2], [1], [0]],
    [[2], [0], [3], [1]],
    [[3, 1], [0, 2]],
    [[1, 3, 0, 2]],
]


@pytest.mark.parametrize("batches", ORDER_CASES)
def test_outputs_are_in_root_order_whatever_the_completion_order(batches: list[list[int]]) -> None:
    core = make()
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(4), 0)
    ids, where = root_ids(cmds), placement(cmds)
    seen: list[ConvergeTaskCalls] = []
    for now, batch in enumerate(batches, start=1):
        by_ex: dict[str, list[int]] = {}
        for i in batch:
            by_ex.setdefault(where[ids[i]], []).append(i)
        for ex, indexes in by_ex.items():
            out = core.calls_completed(
                ex, [ids[i] for i in indexes], [result(i) for i in indexes], now
            )
            seen += converges(out)
            assert of(out, SendCalls) == []
    assert seen == [CallsConverged(task_id="t1", outputs=tagged([result(i) for i in range(4)]))]
    assert not core.has_task("t1")
    assert core.live_calls() == 0
    assert core.executor_load("e1") == core.executor_load("e2") == 0


IGNORED_CASES = ["wrong executor", "unknown executor", "unknown call id", "already completed"]


@pytest.mark.parametrize("case", IGNORED_CASES)
def test_results_the_core_does_not_expect_are_ignored(case: str) -> None:
    core = make()
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(2), 0)
    ids, where = root_ids(cmds), placement(cmds)
    other = {"e1": "e2", "e2": "e1"}
    if case == "already completed":
        assert core.calls_completed(where[ids[0]], [ids[0]], [result(0)], 1) == []
        executor, call_id = where[ids[0]], ids[0]
    else:
        executor, call_id = {
            "wrong executor": (other[where[ids[0]]], ids[0]),
            "unknown executor": ("ghost", ids[0]),
            "unknown call id": (where[ids[0]], max(ids.values()) + 1_000),
        }[case]
    assert core.calls_completed(executor, [call_id], [b'"stale"'], 2) == []
    assert core.has_task("t1")
    # The real results still converge the task, once, without the stale value.
    done = [] if case == "already completed" else [0]
    seen: list[ConvergeTaskCalls] = []
    for i in [*done, 1]:
        seen += converges(core.calls_completed(where[ids[i]], [ids[i]], [result(i)], 3))
    assert seen == [CallsConverged(task_id="t1", outputs=tagged([result(0), result(1)]))]
    assert core.calls_completed(where[ids[1]], [ids[1]], [result(1)], 4) == []


def test_result_of_an_attempt_on_a_lost_executor_is_ignored_even_if_it_returns() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    assert core.executor_lost("e1", "connection reset", 10) == []
    # A restarted e1 reports the old attempt's result: not the current attempt.
    up(core, "e1", now_ms=20)
    assert core.calls_completed("e1", [ids[0]], [b'"old"'], 30) == []
    retry = core.tick(110)
    assert placement(retry) == {ids[0]: "e1"}
    assert core.calls_completed("e1", [ids[0]], [result(0)], 120) == [
        CallsConverged(task_id="t1", outputs=tagged([result(0)]))
    ]


# ---- OUTPUT_BYTES_EXCEEDED -----------------------------------------------------------------

OUTPUT_CASES = [
    # (max_collected_output_bytes, result sizes in completion order, fails at completion #)
    (10, [5, 5], None),
    (10, [5, 6], 2),
    (10, [11, 1, 1], 1),
    (9, [3, 3, 3], None),
    (8, [3, 3, 3], 3),
    (1, [1], None),
]


@pytest.mark.parametrize(("limit", "sizes", "fails_at"), OUTPUT_CASES)
def test_output_bytes_exceeded(limit: int, sizes: list[int], fails_at: int | None) -> None:
    core = make(max_collected_output_bytes=limit)
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(len(sizes)), 0)
    ids, where = root_ids(cmds), placement(cmds)
    for n, size in enumerate(sizes, start=1):
        out = core.calls_completed(where[ids[n - 1]], [ids[n - 1]], [b"x" * size], n)
        if n == fails_at:
            converge = only_failure(out)
            assert converge.task_id == "t1"
            assert isinstance(converge, CallsFailed)
            assert converge.failure_code is FailureCode.OUTPUT_BYTES_EXCEEDED
            assert str(limit) in converge.failure_message
            assert values(converge) == []
            rest = {(where[ids[i]], ids[i]) for i in range(n, len(sizes))}
            assert cancelled(out) == rest
            assert out[-1] == converge
            assert core.live_calls() == 0
            break
        if n == len(sizes):
            assert values(only_converge(out)) == [b"x" * s for s in sizes]
        else:
            assert out == []
    else:
        assert fails_at is None


def test_sub_call_results_do_not_count_towards_output_bytes() -> None:
    core = make(max_collected_output_bytes=4)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    child = placement(core.subcall_requested("e1", ids[0], CODE, "helper", [], 1))
    [cid] = child
    big = b'"' + b"x" * 100 + b'"'
    assert of(core.calls_completed("e1", [cid], [big], 2), ResumeWithResult)
    assert isinstance(
        only_converge(core.calls_completed("e1", [ids[0]], [b"1234"], 3)), CallsConverged
    )


# ---- call_failed: fastFail and retries -------------------------------------------------------

NON_RETRYABLE = [k for k in CallFailureKind if k is not CallFailureKind.EXECUTOR_LOST]
TRACEBACK = 'Traceback (most recent call last):\n  File "m.py", line 3\nValueError: bad block'


@pytest.mark.parametrize("kind", NON_RETRYABLE)
def test_non_retryable_failure_fast_fails_the_task(kind: CallFailureKind) -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1", "e2")
    args = [[i, f"blk{i}"] for i in range(6)]
    cmds = core.start_task("t1", CODE, FN, args, 0)
    ids, where = root_ids(cmds), placement(cmds)
    assert core.calls_completed(where[ids[5]], [ids[5]], [result(5)], 1) == []
    out = core.call_failed(where[ids[2]], ids[2], kind, TRACEBACK, 2)
    converge = only_failure(out)
    assert out[-1] == converge
    assert converge.task_id == "t1"
    assert isinstance(converge, CallsFailed)
    assert converge.failure_code is FailureCode.CALL_FAILED
    assert values(converge) == []
    for part in ("#2", FN, "blk2", kind.value, TRACEBACK):
        assert part in converge.failure_message
    assert "attempts" not in converge.failure_message
    # The other in-flight calls are cancelled, one CancelCalls per executor.
    cancels = of(out, CancelCalls)
    assert len({c.executor_id for c in cancels}) == len(cancels)
    assert cancelled(out) == {(where[ids[i]], ids[i]) for i in (0, 1, 3, 4)}
    assert {type(c) for c in out} == {CancelCalls, CallsFailed}
    # Nothing about the task is reported again.
    assert core.calls_completed(where[ids[0]], [ids[0]], [result(0)], 3) == []
    assert core.call_failed(where[ids[1]], ids[1], kind, "again", 3) == []
    assert core.tick(10**6) == []
    assert core.live_calls() == 0


def test_fast_fail_also_stops_roots_not_yet_dispatched() -> None:
    core = make(initial_window=2, task_max_inflight_calls=2)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(10), 0))
    assert sorted(ids) == [0, 1]
    out = core.call_failed("e1", ids[0], CallFailureKind.USER_ERROR, "boom", 1)
    assert cancelled(out) == {("e1", ids[1])}
    assert only_failure(out).failure_code is FailureCode.CALL_FAILED
    assert core.calls_completed("e1", [ids[1]], [result(1)], 2) == []
    assert core.live_calls() == 0


def test_fast_fail_spares_other_tasks() -> None:
    core = make()
    up(core, "e1")
    a = root_ids(core.start_task("a", CODE, FN, roots(2), 0))
    b = root_ids(core.start_task("b", CODE, FN, roots(1), 0))
    out = core.call_failed("e1", a[0], CallFailureKind.IO_ERROR, "read failed", 1)
    assert cancelled(out) == {("e1", a[1])}
    assert only_converge(out).task_id == "a"
    assert core.calls_completed("e1", [b[0]], [result(0)], 2) == [
        CallsConverged(task_id="b", outputs=tagged([result(0)]))
    ]


def test_failure_from_another_executor_or_for_an_unknown_call_is_ignored() -> None:
    core = make()
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(2), 0)
    ids, where = root_ids(cmds), placement(cmds)
    wrong = "e2" if where[ids[0]] == "e1" else "e1"
    assert core.call_failed(wrong, ids[0], CallFailureKind.USER_ERROR, "x", 1) == []
    assert core.call_failed("ghost", ids[0], CallFailureKind.USER_ERROR, "x", 1) == []
    assert core.call_failed("e1", 10_000, CallFailureKind.USER_ERROR, "x", 1) == []
    assert core.has_task("t1")
    assert core.task_inflight("t1") == 2


def test_retryable_failure_is_retried_after_backoff_then_fails_for_good() -> None:
    policy = CallRetryPolicy(max_attempts=4, backoff_ms=100, backoff_max_ms=250)
    core = make(retry=policy, executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(2), 0))
    lost = CallFailureKind.EXECUTOR_LOST
    # (fail at, due): back-off 100, 200, then capped at 250.
    for failed_at, due in [(1_000, 1_100), (2_000, 2_200), (3_000, 3_250)]:
        assert core.call_failed("e1", ids[0], lost, "pipe closed", failed_at) == []
        assert core.task_inflight("t1") == 2  # still counts against the window
        assert core.next_deadline_ms() == due
        assert core.tick(due - 1) == []
        assert core.tick(due) == [
            SendCalls(
                executor_id="e1",
                task_id="t1",
                code=CODE,
                function=FN,
                budget_ms=core.config.call_deadline_ms,
                call_ids=[ids[0]],
                args=[[0]],
            )
        ]
        assert core.tick(due + 10_000) == []
    out = core.call_failed("e1", ids[0], lost, "pipe closed", 4_000)
    converge = only_failure(out)
    assert converge.failure_code is FailureCode.CALL_FAILED
    for part in ("#0", FN, "after 4 attempts", "EXECUTOR_LOST", "pipe closed"):
        assert part in converge.failure_message
    assert cancelled(out) == {("e1", ids[1])}


RETRY_ON_CASES = [
    # (retry_on, failing kind, retried)
    (frozenset({CallFailureKind.USER_ERROR}), CallFailureKind.USER_ERROR, True),
    (frozenset({CallFailureKind.USER_ERROR}), CallFailureKind.EXECUTOR_LOST, False),
    (
        frozenset({CallFailureKind.IO_ERROR, CallFailureKind.BUDGET_EXCEEDED}),
        CallFailureKind.IO_ERROR,
        True,
    ),
    (frozenset(), CallFailureKind.EXECUTOR_LOST, False),
    (frozenset({CallFailureKind.EXECUTOR_LOST}), CallFailureKind.EXECUTOR_LOST, True),
    (frozenset({CallFailureKind.EXECUTOR_LOST}), CallFailureKind.WRITE_FORBIDDEN, False),
]


@pytest.mark.parametrize(("retry_on", "kind", "retried"), RETRY_ON_CASES)
def test_retry_policy_decides_which_kinds_are_retried(
    retry_on: frozenset[CallFailureKind], kind: CallFailureKind, retried: bool
) -> None:
    core = make(retry=CallRetryPolicy(retry_on=retry_on), executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    out = core.call_failed("e1", ids[0], kind, "msg", 0)
    if retried:
        assert out == []
        assert placement(core.tick(100)) == {ids[0]: "e1"}
    else:
        assert only_failure(out).failure_code is FailureCode.CALL_FAILED
        assert core.tick(100) == []


def test_max_attempts_one_means_no_retry() -> None:
    core = make(retry=CallRetryPolicy(max_attempts=1))
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    out = core.call_failed("e1", ids[0], CallFailureKind.EXECUTOR_LOST, "gone", 0)
    message = only_failure(out).failure_message
    assert "EXECUTOR_LOST" in message
    assert "attempts" not in message


@pytest.mark.parametrize("kind", [CallFailureKind.WRITE_FORBIDDEN, CallFailureKind.EXECUTOR_LOST])
def test_cancel_on_executor_cancels_the_failed_call_there(kind: CallFailureKind) -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    out = core.call_failed("e1", ids[0], kind, "write attempted", 5, cancel_on_executor=True)
    assert out[0] == CancelCalls(executor_id="e1", call_ids=[ids[0]])
    if kind is CallFailureKind.EXECUTOR_LOST:
        assert out == [CancelCalls(executor_id="e1", call_ids=[ids[0]])]
        assert placement(core.tick(105)) == {ids[0]: "e1"}
    else:
        assert only_failure(out).failure_code is FailureCode.CALL_FAILED
        assert "WRITE_FORBIDDEN" in only_failure(out).failure_message


def test_without_cancel_on_executor_no_cancel_is_sent_for_the_failed_call() -> None:
    core = make()
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    out = core.call_failed("e1", ids[0], CallFailureKind.USER_ERROR, "boom", 5)
    assert of(out, CancelCalls) == []
    assert len(out) == 1


# ---- sub-calls -------------------------------------------------------------------------------


def one_root_on_e1(**fields: Any) -> tuple[DispatcherCore, int]:
    """Executors e1 and e2; one root call, which lands on e1."""
    core = make(executor_heartbeat_timeout_ms=NO_HB, **fields)
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(1), 0)
    [(root, ex)] = placement(cmds).items()
    assert ex == "e1"
    return core, root


def subcall(
    core: DispatcherCore, ex: str, parent: int, function: str = "helper"
) -> tuple[int, str]:
    cmds = core.subcall_requested(ex, parent, "lib@2", function, [parent, "x"], 1)
    [send] = of(cmds, SendCalls)
    assert cmds == [send]
    assert send.task_id == "t1"
    assert (send.code, send.function, send.args) == ("lib@2", function, [[parent, "x"]])
    [child] = send.call_ids
    return child, send.executor_id


def test_subcall_bypasses_a_full_window() -> None:
    core = make(initial_window=1, task_max_inflight_calls=1)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(3), 0))
    assert list(ids) == [0]
    child, ex = subcall(core, "e1", ids[0])
    assert ex == "e1"
    grandchild, _ = subcall(core, "e1", child)
    assert grandchild != child
    assert core.task_inflight("t1") == 1
    assert core.call_task(child) == core.call_task(grandchild) == "t1"
    assert core.call_code(child) == "lib@2"


def test_child_result_resumes_the_parent_on_the_parents_executor() -> None:
    core, root = one_root_on_e1()
    child, child_ex = subcall(core, "e1", root)
    assert child_ex == "e2"  # the emptier executor
    out = core.calls_completed("e2", [child], [b'{"v": 42}'], 2)
    assert out == [
        ResumeWithResult(
            executor_id="e1", call_id=root, result=SubCallReturned(value_json=b'{"v": 42}')
        )
    ]
    # The parent's own result is the only output.
    assert core.calls_completed("e1", [root], [result(0)], 3) == [
        CallsConverged(task_id="t1", outputs=tagged([result(0)]))
    ]
    assert core.live_calls() == 0


def test_nested_subcalls_resume_each_parent_in_turn() -> None:
    core, root = one_root_on_e1()
    child, child_ex = subcall(core, "e1", root)
    grandchild, grand_ex = subcall(core, child_ex, child, "leaf")
    assert core.calls_completed(grand_ex, [grandchild], [b"7"], 2) == [
        ResumeWithResult(
            executor_id=child_ex, call_id=child, result=SubCallReturned(value_json=b"7")
        )
    ]
    assert core.calls_completed(child_ex, [child], [b"8"], 3) == [
        ResumeWithResult(executor_id="e1", call_id=root, result=SubCallReturned(value_json=b"8"))
    ]
    assert values(only_converge(core.calls_completed("e1", [root], [b"9"], 4))) == [b"9"]


@pytest.mark.parametrize("kind", NON_RETRYABLE)
def test_child_terminal_failure_resumes_the_parent_with_the_error(kind: CallFailureKind) -> None:
    core, root = one_root_on_e1()
    child, child_ex = subcall(core, "e1", root)
    out = core.call_failed(child_ex, child, kind, TRACEBACK, 2)
    assert out == [
        ResumeWithResult(
            executor_id="e1",
            call_id=root,
            result=SubCallFailed(failure=Failure(kind, TRACEBACK, is_retryable(kind))),
        )
    ]
    # The parent may handle it: the task is still alive and can succeed.
    assert core.has_task("t1")
    assert isinstance(
        only_converge(core.calls_completed("e1", [root], [result(0)], 3)), CallsConverged
    )


def test_child_retryable_failure_is_retried_and_resumes_only_when_terminal() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(max_attempts=2, backoff_ms=10))
    child, child_ex = subcall(core, "e1", root)
    lost = CallFailureKind.EXECUTOR_LOST
    assert core.call_failed(child_ex, child, lost, "died", 100) == []
    again = placement(core.tick(110))
    assert list(again) == [child]
    out = core.call_failed(again[child], child, lost, "died again", 200)
    assert out == [
        ResumeWithResult(
            executor_id="e1",
            call_id=root,
            result=SubCallFailed(
                failure=Failure(CallFailureKind.EXECUTOR_LOST, "died again", retryable=True)
            ),
        )
    ]
    assert core.has_task("t1")


def test_subcall_request_for_an_unknown_parent_or_from_the_wrong_executor_is_ignored() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(backoff_ms=50))
    assert core.subcall_requested("e2", root, CODE, "helper", [], 1) == []
    assert core.subcall_requested("ghost", root, CODE, "helper", [], 1) == []
    assert core.subcall_requested("e1", root + 1_000, CODE, "helper", [], 1) == []
    # A parent waiting for its retry is on no executor: nobody can ask for it.
    assert core.call_failed("e1", root, CallFailureKind.EXECUTOR_LOST, "x", 2) == []
    assert core.subcall_requested("e1", root, CODE, "helper", [], 3) == []
    assert core.live_calls() == 1
    assert core.executor_load("e1") == core.executor_load("e2") == 0


def test_parent_attempt_failure_cancels_children_and_grandchildren() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(backoff_ms=50))
    child, child_ex = subcall(core, "e1", root)
    grandchild, grand_ex = subcall(core, child_ex, child, "leaf")
    out = core.call_failed("e1", root, CallFailureKind.EXECUTOR_LOST, "x", 10)
    assert cancelled(out) == {(child_ex, child), (grand_ex, grandchild)}
    assert len({c.executor_id for c in of(out, CancelCalls)}) == len(of(out, CancelCalls))
    assert {type(c) for c in out} == {CancelCalls}
    # Their late results are ignored; the parent's retry goes out alone.
    assert core.calls_completed(grand_ex, [grandchild], [b"1"], 11) == []
    assert core.calls_completed(child_ex, [child], [b"2"], 11) == []
    assert core.call_failed(child_ex, child, CallFailureKind.USER_ERROR, "x", 11) == []
    assert core.live_calls() == 1
    assert list(placement(core.tick(60))) == [root]


def test_parent_executor_lost_cancels_children_on_other_executors_only() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(backoff_ms=50))
    child, child_ex = subcall(core, "e1", root)
    _, grand_ex = subcall(core, child_ex, child, "leaf")
    assert (child_ex, grand_ex) == ("e2", "e1")
    out = core.executor_lost("e1", "segfault", 10)
    # The grandchild died with e1; only e2 is told to drop the child.
    assert out == [CancelCalls(executor_id="e2", call_ids=[child])]
    assert core.calls_completed("e2", [child], [b"2"], 11) == []
    assert core.live_calls() == 1
    assert placement(core.tick(60)) == {root: "e2"}


def test_child_on_a_lost_executor_is_retried_while_its_parent_waits() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(backoff_ms=50))
    child, child_ex = subcall(core, "e1", root)
    assert core.executor_lost(child_ex, "oom", 10) == []
    assert placement(core.tick(60)) == {child: "e1"}
    assert core.calls_completed("e1", [child], [b"5"], 61) == [
        ResumeWithResult(executor_id="e1", call_id=root, result=SubCallReturned(value_json=b"5"))
    ]


def test_parent_completing_cancels_its_pending_subcalls() -> None:
    core, root = one_root_on_e1(retry=CallRetryPolicy(backoff_ms=50))
    child, child_ex = subcall(core, "e1", root)
    out = core.calls_completed("e1", [root], [result(0)], 2)
    assert isinstance(only_converge(out), CallsConverged)
    # Regression: the parent's attempt ended, so its pending sub-calls are cancelled and
    # nothing of the converged task stays in the core (it used to keep the child live,
    # in e2's load, and re-send it after a retryable failure).
    assert cancelled(out) == {(child_ex, child)}
    assert core.live_calls() == 0
    assert core.executor_load(child_ex) == 0
    assert core.calls_completed(child_ex, [child], [b"1"], 3) == []
    assert core.call_failed(child_ex, child, CallFailureKind.EXECUTOR_LOST, "x", 3) == []
    assert core.tick(10**6) == []


def test_sub_call_completing_cancels_its_own_pending_sub_calls() -> None:
    core, root = one_root_on_e1()
    child, child_ex = subcall(core, "e1", root)
    grandchild, grand_ex = subcall(core, child_ex, child, "leaf")
    out = core.calls_completed(child_ex, [child], [b"3"], 2)
    assert out == [
        CancelCalls(executor_id=grand_ex, call_ids=[grandchild]),
        ResumeWithResult(executor_id="e1", call_id=root, result=SubCallReturned(value_json=b"3")),
    ]
    assert core.calls_completed(grand_ex, [grandchild], [b"4"], 3) == []
    assert core.live_calls() == 1


def test_calls_of_different_code_are_never_batched_together() -> None:
    core = make(retry=CallRetryPolicy(backoff_ms=100), executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(2), 0))
    # Root 0 awaits the same function name from another code reference.
    cmds = core.subcall_requested("e1", ids[0], "other@7", FN, ["x"], 1)
    [child] = placement(cmds)
    assert core.call_code(child) == "other@7"
    lost = CallFailureKind.EXECUTOR_LOST
    assert core.call_failed("e1", child, lost, "x", 10) == []
    assert core.call_failed("e1", ids[1], lost, "x", 10) == []
    sends = of(core.tick(110), SendCalls)
    assert sorted(cid for s in sends for cid in s.call_ids) == sorted([child, ids[1]])
    # Regression: the retried root (CODE) and sub-call ("other@7") of the same function
    # fall due in one tick; they used to go out in ONE SendCalls with code=CODE.
    for s in sends:
        for cid in s.call_ids:
            assert s.code == core.call_code(cid), s


# ---- executors -----------------------------------------------------------------------------


def test_executor_lost_reschedules_its_calls_on_the_others() -> None:
    """The call that held the lost executor is charged an attempt and retried after
    its back-off; the one queued behind it did nothing wrong and goes again at once."""
    core = make(retry=CallRetryPolicy(backoff_ms=100), executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(4), 0)
    where = placement(cmds)
    held, queued = sorted(cid for cid, ex in where.items() if ex == "e1")
    assert core.holding_call("e1") == held
    assert placement(core.executor_lost("e1", "exit code 137", 1_000)) == {queued: "e2"}
    assert core.executor_ids() == ["e2"]
    assert core.task_inflight("t1") == 4
    assert core.next_deadline_ms() == 1_100
    assert core.tick(1_099) == []
    assert placement(core.tick(1_100)) == {held: "e2"}
    assert core.executor_load("e2") == 4
    assert core.executor_lost("e1", "twice", 1_101) == []  # unknown now: nothing


def test_executor_lost_counts_an_attempt() -> None:
    core = make(
        retry=CallRetryPolicy(max_attempts=2, backoff_ms=10), executor_heartbeat_timeout_ms=NO_HB
    )
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    assert core.executor_lost("e1", "first", 0) == []
    up(core, "e2")
    assert placement(core.tick(10)) == {ids[0]: "e2"}
    out = core.executor_lost("e2", "second", 20)
    converge = only_failure(out)
    assert converge.failure_code is FailureCode.CALL_FAILED
    for part in ("after 2 attempts", "EXECUTOR_LOST", "e2", "second"):
        assert part in converge.failure_message
    assert out == [converge]


def test_retry_with_no_executor_up_waits_for_one() -> None:
    core = make(retry=CallRetryPolicy(backoff_ms=100), executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(2), 0))
    assert core.executor_lost("e1", "gone", 0) == []
    assert core.tick(100) == []
    assert core.next_deadline_ms() is None
    cmds = core.executor_up("e2", 500)
    assert placement(cmds) == {ids[0]: "e2", ids[1]: "e2"}


def budget_setup() -> tuple[DispatcherCore, dict[int, int], dict[int, int], dict[int, str]]:
    """Budget 1000 ms, heartbeat timeout 3000 ms; tasks a and b, one root of each on e1
    and on e2."""
    core = make(call_deadline_ms=1_000, executor_heartbeat_timeout_ms=3_000)
    up(core, "e1", "e2")
    a_cmds = core.start_task("a", CODE, FN, roots(2), 0)
    b_cmds = core.start_task("b", CODE, FN, roots(2), 0)
    where = placement(a_cmds) | placement(b_cmds)
    a, b = root_ids(a_cmds), root_ids(b_cmds)
    assert {where[a[0]], where[a[1]]} == {where[b[0]], where[b[1]]} == {"e1", "e2"}
    return core, a, b, where


def test_heartbeat_over_budget_kills_the_executor_and_fails_the_call() -> None:
    core, a, b, where = budget_setup()
    ex = where[a[0]]
    other = "e2" if ex == "e1" else "e1"
    b_on_ex = b[0] if where[b[0]] == ex else b[1]
    # Exactly on budget is fine.
    assert core.executor_heartbeat(ex, a[0], 1_000_000, 100) == []
    out = core.executor_heartbeat(ex, a[0], 1_000_001, 200)
    kills = of(out, KillExecutor)
    assert [k.executor_id for k in kills] == [ex]
    assert out[0] == kills[0]
    converge = only_failure(out)
    assert converge.task_id == "a"
    assert converge.failure_code is FailureCode.CALL_FAILED
    for part in ("#0", "BUDGET_EXCEEDED", "1000 ms"):
        assert part in converge.failure_message
    # Task a's call on the surviving executor is cancelled; nothing goes to the dead one.
    assert cancelled(out) == {(other, a[1])}
    assert core.executor_ids() == [other]
    # Task b's call on the killed executor did nothing wrong: it goes to the other one
    # at once, with no attempt counted.
    assert core.has_task("b")
    assert placement(out) == {b_on_ex: other}


def test_heartbeat_over_budget_is_retried_when_the_policy_says_so() -> None:
    core = make(
        call_deadline_ms=1_000,
        retry=CallRetryPolicy(retry_on=frozenset({CallFailureKind.BUDGET_EXCEEDED})),
        executor_heartbeat_timeout_ms=NO_HB,
    )
    up(core, "e1", "e2")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    out = core.executor_heartbeat("e1", ids[0], 2_000_000, 10)
    assert [k.executor_id for k in of(out, KillExecutor)] == ["e1"]
    assert out == of(out, KillExecutor)
    assert placement(core.tick(110)) == {ids[0]: "e2"}


def test_over_budget_sub_call_sharing_its_parents_executor_resumes_nobody() -> None:
    core = make(
        call_deadline_ms=1_000,
        retry=CallRetryPolicy(backoff_ms=100),
        executor_heartbeat_timeout_ms=NO_HB,
    )
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 0))
    child = placement(core.subcall_requested("e1", ids[0], CODE, "helper", [], 1))
    [cid] = child
    # The child fails for good, but its parent died with the same executor: the parent
    # is retried (and will ask again); there is no executor to resume.
    out = core.executor_heartbeat("e1", cid, 1_000_001, 10)
    assert out == [
        KillExecutor(executor_id="e1", reason="a call exceeded its budget", over_budget_call_id=cid)
    ]
    assert core.has_task("t1")
    assert core.live_calls() == 1
    up(core, "e2", now_ms=20)
    assert placement(core.tick(110)) == {ids[0]: "e2"}


def test_heartbeat_over_budget_for_a_call_it_does_not_hold_kills_it_blaming_nobody() -> None:
    """An executor still running a call the core let go (cancelled, or moved away) is
    killed; that call is not charged, and calls of other executors are untouched."""
    core, a, _, where = budget_setup()
    other = "e2" if where[a[0]] == "e1" else "e1"
    out = core.executor_heartbeat(other, a[0], 10**9, 100)
    assert [k.executor_id for k in of(out, KillExecutor)] == [other]
    assert not converges(out)  # a[0] is not blamed: its task goes on
    assert core.executor_ids() == [where[a[0]]]
    assert core.executor_heartbeat("ghost", a[0], 10**9, 100) == []


def test_a_cancelled_call_still_running_past_the_budget_gets_its_executor_killed() -> None:
    core = make(call_deadline_ms=1_000, executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    [call] = root_ids(core.start_task("t1", CODE, FN, roots(1), 0)).values()
    core.cancel_task("t1", 10)
    assert core.executor_heartbeat("e1", call, 999_000, 20) == []  # within the budget
    out = core.executor_heartbeat("e1", call, 1_000_001, 30)
    assert [k.executor_id for k in of(out, KillExecutor)] == ["e1"]
    assert core.executor_ids() == []


def test_a_task_budget_overrides_the_default() -> None:
    core = make(call_deadline_ms=5_000, executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    cmds = core.start_task("t1", CODE, FN, roots(1), 0, budget_ms=200)
    [send] = of(cmds, SendCalls)
    assert send.budget_ms == 200
    [call] = send.call_ids
    assert core.executor_heartbeat("e1", call, 200_000, 10) == []
    out = core.executor_heartbeat("e1", call, 200_001, 20)
    [converged] = converges(out)
    assert isinstance(converged, CallsFailed)
    assert "BUDGET_EXCEEDED" in converged.failure_message
    assert "budget of 200 ms" in converged.failure_message


SILENT_CASES = [
    # (call_deadline_ms, running call reported?, running_us, charged)
    (5_000, False, 0, False),
    (5_000, True, 0, False),
    (5_000, True, 1_999_000, False),  # 1999 + 3001 = 5000 ms: on budget
    (5_000, True, 1_999_001, True),
    (5_000, True, 4_000_000, True),
    (1_000, True, 0, True),  # the silence alone is over budget
    (1_000, False, 0, False),  # idle: nobody is blamed
]


@pytest.mark.parametrize(("budget", "running", "running_us", "charged"), SILENT_CASES)
def test_silent_executor_is_killed_after_the_heartbeat_timeout(
    budget: int, running: bool, running_us: int, charged: bool
) -> None:
    core = make(call_deadline_ms=budget, executor_heartbeat_timeout_ms=3_000)
    up(core, "e1", "e2")
    cmds = core.start_task("a", CODE, FN, roots(2), 0)
    a, where = root_ids(cmds), placement(cmds)
    assert where[a[0]] == "e1"
    assert core.executor_heartbeat("e1", a[0] if running else 0, running_us, 0) == []
    assert core.executor_heartbeat("e2", 0, 0, 2_000) == []
    assert core.next_deadline_ms() == 3_001
    assert core.tick(3_000) == []
    out = core.tick(3_001)
    # Without a measure of its CPU, its silence counts as the running call's.
    reason = "a call exceeded its budget" if charged else "no heartbeat for 3001 ms"
    assert (
        out[:1]
        == of(out, KillExecutor)
        == [
            KillExecutor(
                executor_id="e1",
                reason=reason,
                over_budget_call_id=a[0] if charged else None,  # the call it blames
            )
        ]
    )
    if charged:
        converge = only_failure(out)
        assert converge.failure_code is FailureCode.CALL_FAILED
        assert "BUDGET_EXCEEDED" in converge.failure_message
        assert cancelled(out) == {("e2", a[1])}
    else:
        assert out == out[:1]
        assert core.has_task("a")
        assert placement(core.tick(3_101)) == {a[0]: "e2"}


def test_a_heartbeat_keeps_an_executor_alive() -> None:
    core = make(executor_heartbeat_timeout_ms=3_000)
    up(core, "e1")
    assert core.executor_heartbeat("e1", 0, 0, 2_000) == []
    assert core.tick(3_001) == []
    assert core.tick(5_000) == []
    assert core.tick(5_001) == [KillExecutor(executor_id="e1", reason="no heartbeat for 3001 ms")]
    assert core.executor_ids() == []
    # Once killed, its heartbeats and results are unknown.
    assert core.executor_heartbeat("e1", 0, 0, 5_002) == []


def test_next_deadline_is_the_earliest_retry_or_heartbeat_timeout() -> None:
    core = make(executor_heartbeat_timeout_ms=3_000, retry=CallRetryPolicy(backoff_ms=100))
    assert core.next_deadline_ms() is None
    up(core, "e1", now_ms=10)
    assert core.next_deadline_ms() == 3_011
    up(core, "e2", now_ms=20)
    assert core.next_deadline_ms() == 3_011
    assert core.executor_heartbeat("e1", 0, 0, 500) == []
    assert core.next_deadline_ms() == 3_021
    ids = root_ids(core.start_task("t1", CODE, FN, roots(1), 600))
    executor = "e1" if core.executor_load("e1") else "e2"
    assert core.call_failed(executor, ids[0], CallFailureKind.EXECUTOR_LOST, "x", 1_000) == []
    assert core.next_deadline_ms() == 1_100
    assert placement(core.tick(1_100)) == {ids[0]: "e1"}
    assert core.next_deadline_ms() == 3_021
    assert core.executor_heartbeat("e2", 0, 0, 2_000) == []
    assert core.executor_heartbeat("e1", 0, 0, 2_500) == []
    assert core.next_deadline_ms() == 5_001


# ---- cancel_task -----------------------------------------------------------------------------


def test_cancel_task_cancels_every_call_and_does_not_converge() -> None:
    core = make(retry=CallRetryPolicy(backoff_ms=100), executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1", "e2")
    cmds = core.start_task("t1", CODE, FN, roots(4), 0)
    ids, where = root_ids(cmds), placement(cmds)
    other = root_ids(core.start_task("t2", CODE, FN, roots(1), 0))
    child, child_ex = subcall(core, where[ids[0]], ids[0])
    # Root 3 is waiting for its retry: it is on no executor.
    assert core.call_failed(where[ids[3]], ids[3], CallFailureKind.EXECUTOR_LOST, "x", 1) == []
    out = core.cancel_task("t1", 2)
    cancels = of(out, CancelCalls)
    assert out == cancels  # and no ConvergeTaskCalls
    assert len({c.executor_id for c in cancels}) == len(cancels)
    expected = {(where[ids[i]], ids[i]) for i in range(3)} | {(child_ex, child)}
    assert cancelled(out) == expected
    assert not core.has_task("t1")
    assert core.live_calls() == 1  # t2's root
    # Late events for the cancelled task do nothing.
    assert core.calls_completed(where[ids[1]], [ids[1]], [result(1)], 3) == []
    assert core.call_failed(where[ids[2]], ids[2], CallFailureKind.USER_ERROR, "x", 3) == []
    assert core.subcall_requested(where[ids[1]], ids[1], CODE, "h", [], 3) == []
    assert core.tick(1_000) == []
    assert core.cancel_task("t1", 4) == []
    # The other task is untouched.
    t2_ex = "e1" if core.executor_load("e1") else "e2"
    assert only_converge(core.calls_completed(t2_ex, [other[0]], [result(0)], 5)).task_id == "t2"


def test_cancel_task_waiting_for_an_executor_sends_nothing_later() -> None:
    core = make()
    assert core.start_task("t1", CODE, FN, roots(3), 0) == []
    assert core.cancel_task("t1", 1) == []
    assert core.live_calls() == 0
    assert core.executor_up("e1", 2) == []


def test_cancel_unknown_task_is_a_no_op() -> None:
    core = make()
    up(core, "e1")
    assert core.cancel_task("nope", 0) == []


# ---- root calls that come incrementally ---------------------------------------------------


def complete_all(core: DispatcherCore, cmds: Sequence[DispatchCommand], now_ms: int) -> list[Any]:
    """Complete every call the commands sent (result: the first argument as JSON),
    and every call those completions send in turn; return all commands."""
    seen: list[DispatchCommand] = []
    pending = list(cmds)
    while pending:
        seen += pending
        sends = of(pending, SendCalls)
        pending = []
        for s in sends:
            results = [str(args[0]).encode() for args in s.args]
            pending += core.calls_completed(s.executor_id, s.call_ids, results, now_ms)
    return seen


def test_an_open_task_converges_only_when_its_source_is_done() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    assert core.open_task("t1", CODE, FN, 0) == []
    first = complete_all(core, core.add_roots("t1", [[0], [1]], 1), 1)
    assert converges(first) == []
    assert core.has_task("t1")
    assert core.add_roots("t1", [], 2) == []
    more = complete_all(core, core.add_roots("t1", [[2]], 3), 3)
    assert converges(more) == []
    assert core.roots_done("t1", 4) == [
        CallsConverged(task_id="t1", outputs=tagged([b"0", b"1", b"2"]))
    ]
    assert not core.has_task("t1")


def test_taken_outputs_are_the_done_prefix_and_the_task_converges_with_the_rest() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    core.open_task("t1", CODE, FN, 0)
    sent = core.add_roots(
        "t1", [RootCall(args=[i], context=CallContext(block_number=i)) for i in range(4)], 0
    )
    ids, ex = root_ids(sent), "e1"
    assert list(core.take_outputs("t1")) == []
    # Roots 0, 1 and 3 done: only 0 and 1 are done in a row.
    core.calls_completed(ex, [ids[0], ids[1], ids[3]], [b"0", b"1", b"3"], 1)
    assert list(core.take_outputs("t1")) == [
        RootOutput(0, b"0", CallContext(block_number=0)),
        RootOutput(1, b"1", CallContext(block_number=1)),
    ]
    assert list(core.take_outputs("t1")) == []
    more = complete_all(core, core.add_roots("t1", [[4]], 2), 2)
    assert converges(more) == []
    core.calls_completed(ex, [ids[2]], [b"2"], 3)
    assert [o.index for o in core.take_outputs("t1")] == [2, 3, 4]
    # The task converges with the outputs not taken, under their roots' indexes.
    assert converges(complete_all(core, core.add_roots("t1", [[5]], 4), 4)) == []
    assert core.roots_done("t1", 5) == [CallsConverged(task_id="t1", outputs=[RootOutput(5, b"5")])]
    assert core.take_outputs("t1") == []


def test_roots_done_before_the_roots_finish_converges_at_the_last_result() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    core.open_task("t1", CODE, FN, 0)
    sent = core.add_roots("t1", [[0], [1]], 0)
    assert core.roots_done("t1", 1) == []
    assert values(only_converge(complete_all(core, sent, 2))) == [b"0", b"1"]


def test_an_empty_source_converges_with_no_outputs() -> None:
    core = make()
    core.open_task("t1", CODE, FN, 0)
    assert core.roots_done("t1", 0) == [CallsConverged(task_id="t1")]


def test_roots_added_after_the_source_is_done_are_a_caller_bug() -> None:
    core = make()
    up(core, "e1")
    core.open_task("t1", CODE, FN, 0)
    core.add_roots("t1", [[0]], 0)
    core.roots_done("t1", 0)
    with pytest.raises(BlockxUsageError):
        core.add_roots("t1", [[1]], 0)


def test_roots_added_to_a_failed_task_are_ignored() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    core.open_task("t1", CODE, FN, 0)
    [root] = placement(core.add_roots("t1", [[0]], 0))
    failed = core.call_failed("e1", root, CallFailureKind.USER_ERROR, "boom", 1)
    assert only_failure(failed).failure_code is FailureCode.CALL_FAILED
    assert core.add_roots("t1", [[1]], 2) == []
    assert core.roots_done("t1", 2) == []


def test_the_window_spans_chunks() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB, initial_window=2)
    up(core, "e1")
    core.open_task("t1", CODE, FN, 0)
    assert len(placement(core.add_roots("t1", [[0]], 0))) == 1
    assert len(placement(core.add_roots("t1", [[1], [2], [3]], 0))) == 1
    assert core.task_inflight("t1") == 2


# ---- keyword arguments, contexts, failures as fields --------------------------------------

BLOCK = CallContext(block_number=7, block_hash="0x07")


def test_batches_carry_kwargs_and_contexts_only_when_some_call_has_them() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    [plain] = of(core.start_task("a", CODE, FN, [RootCall([0]), [1]], 0), SendCalls)
    assert (plain.kwargs, plain.contexts) == (None, None)
    calls = [RootCall([0], {"x": 1}), RootCall([1], context=BLOCK), RootCall([2])]
    [send] = of(core.start_task("b", CODE, FN, calls, 0), SendCalls)
    assert send.args == [[0], [1], [2]]
    assert send.kwargs == [{"x": 1}, {}, {}]
    assert send.contexts == [None, BLOCK, None]
    converge = only_converge(complete_all(core, [send], 1))
    assert isinstance(converge, CallsConverged)
    assert converge.outputs == [
        RootOutput(0, b"0"),
        RootOutput(1, b"1", BLOCK),
        RootOutput(2, b"2"),
    ]


def test_a_refill_of_mixed_roots_numbers_them_in_order() -> None:
    """Lists and RootCalls in one window: consecutive call ids, arguments and
    outputs in root order (the list shorthand takes its own path)."""
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    roots: list[RootCall | list[Any]] = [[0], RootCall([1], context=BLOCK), [2], [3]]
    [send] = of(core.start_task("m", CODE, FN, roots, 0), SendCalls)
    first = send.call_ids[0]
    assert send.call_ids == [first, first + 1, first + 2, first + 3]
    assert send.args == [[0], [1], [2], [3]]
    assert send.contexts == [None, BLOCK, None, None]
    converge = only_converge(complete_all(core, [send], 1))
    assert isinstance(converge, CallsConverged)
    assert [o.value_json for o in converge.outputs] == [b"0", b"1", b"2", b"3"]


def test_one_frame_of_two_tasks_results_ends_both() -> None:
    """A frame whose results alternate between two tasks (and an id no longer
    expected): each task gets its own outputs, counts and convergence."""
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    a = root_ids(core.start_task("a", CODE, FN, [[0], [1]], 0))
    b = root_ids(core.start_task("b", CODE, FN, [[10], [11], [12]], 0))
    ids = [a[0], b[10], 999_999, a[1], b[11], b[12]]
    results = [b"0", b"10", b"x", b"1", b"11", b"12"]
    converged = converges(core.calls_completed("e1", ids, results, 1))
    outputs = {
        c.task_id: [o.value_json for o in c.outputs]
        for c in converged
        if isinstance(c, CallsConverged)
    }
    assert outputs == {"a": [b"0", b"1"], "b": [b"10", b"11", b"12"]}


def test_a_sub_call_inherits_its_parents_context_and_carries_its_kwargs() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    [root] = placement(core.start_task("t1", CODE, FN, [RootCall([0], context=BLOCK)], 0))
    [send] = of(
        core.subcall_requested("e1", root, "lib@2", "helper", [1], 1, kwargs={"y": 2}), SendCalls
    )
    assert (send.kwargs, send.contexts) == ([{"y": 2}], [BLOCK])


def test_a_fast_failure_names_the_failed_call() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, [[0], [1, "k"]], 0))
    converge = only_failure(core.call_failed("e1", ids[1], CallFailureKind.BAD_RESULT, "no", 1))
    assert converge.failed_call == CallFailure(
        index=1,
        kind=CallFailureKind.BAD_RESULT,
        message="no",
        attempts=1,
        retryable=False,
        args=[1, "k"],
    )
    assert converge.failure_message == "call #1 score_block(1, 'k') failed: BAD_RESULT: no"


def test_root_call_finds_the_root_of_a_sub_call() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    root = root_ids(core.start_task("t1", CODE, FN, [[0], RootCall([1], {"k": 2})], 0))[1]
    [child] = of(core.subcall_requested("e1", root, "lib@2", "helper", [5], 1), SendCalls)
    [grandchild] = of(
        core.subcall_requested("e1", child.call_ids[0], "lib@2", "helper", [6], 2), SendCalls
    )
    expected = (root, 1, [1], {"k": 2})
    assert core.root_call(root) == expected
    assert core.root_call(child.call_ids[0]) == expected
    assert core.root_call(grandchild.call_ids[0]) == expected
    assert core.root_call(10_000) is None


def test_a_failed_phase_and_its_call_hand_on_their_failures() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    ids = root_ids(core.start_task("t1", CODE, FN, [[0]], 0))
    converge = only_failure(core.call_failed("e1", ids[0], CallFailureKind.BAD_RESULT, "no", 1))
    assert converge.failure == Failure(FailureCode.CALL_FAILED, converge.failure_message, False)
    assert converge.failed_call is not None
    assert converge.failed_call.failure == Failure(CallFailureKind.BAD_RESULT, "no", False)


def test_kwargs_show_in_the_failure_message() -> None:
    core = make(executor_heartbeat_timeout_ms=NO_HB)
    up(core, "e1")
    [root] = placement(core.start_task("t1", CODE, FN, [RootCall([0], {"to": 9})], 0))
    converge = only_failure(core.call_failed("e1", root, CallFailureKind.USER_ERROR, "x", 1))
    assert converge.failure_message == "call #0 score_block(0, to=9) failed: USER_ERROR: x"


@pytest.mark.parametrize(
    ("retryable", "attempts"),
    [
        # A retry policy that lists IO_ERROR retries a read that may pass...
        (True, 2),
        # ...but not one that fails the same way every time (e.g. UNKNOWN_BACKEND).
        (False, 1),
    ],
)
def test_an_attempt_that_cannot_succeed_on_retry_is_not_retried(
    retryable: bool, attempts: int
) -> None:
    policy = CallRetryPolicy(max_attempts=2, retry_on=frozenset({CallFailureKind.IO_ERROR}))
    core = make(executor_heartbeat_timeout_ms=NO_HB, retry=policy)
    up(core, "e1")
    [root] = placement(core.start_task("t1", CODE, FN, roots(1), 0))
    now = 0
    for _ in range(attempts - 1):
        assert (
            core.call_failed("e1", root, CallFailureKind.IO_ERROR, "down", now, retryable=retryable)
            == []
        )
        now += 10_000
        assert list(placement(core.tick(now))) == [root]
    out = core.call_failed("e1", root, CallFailureKind.IO_ERROR, "down", now, retryable=retryable)
    failed = only_failure(out).failed_call
    assert failed is not None
    assert (failed.attempts, failed.retryable) == (attempts, retryable)


# ---- what the adapter could not resolve or answered --------------------------------------


def test_a_missing_function_fails_its_task_at_the_first_root_call() -> None:
    core = make()
    up(core, "e1")
    assert core.open_task("t1", "", FN, 0) == []
    assert core.function_missing("t1", "function 'f' is not defined", 0) == []
    out = core.add_roots("t1", roots(3), 1)
    assert out == [
        CallsFailed(
            task_id="t1",
            failure_code=FailureCode.CALL_FAILED,
            failure_message="FUNCTION_NOT_FOUND: function 'f' is not defined",
            failed_call=CallFailure(
                index=0,
                kind=CallFailureKind.FUNCTION_NOT_FOUND,
                message="function 'f' is not defined",
                retryable=False,
            ),
        )
    ]
    assert not core.has_task("t1")
    assert core.live_calls() == 0


def test_a_missing_function_with_no_root_call_converges_empty() -> None:
    core = make()
    core.open_task("t1", "", FN, 0)
    core.function_missing("t1", "not defined", 0)
    assert core.roots_done("t1", 1) == [CallsConverged(task_id="t1")]
    assert core.function_missing("gone", "not defined", 2) == []


def test_an_unresolved_sub_call_resumes_its_parent_with_function_not_found() -> None:
    core, root = one_root_on_e1()
    core.call_suspended("e1", root, 1)
    out = core.subcall_unresolved("e1", root, "function 'nope' is not defined", 2)
    failure = Failure(CallFailureKind.FUNCTION_NOT_FOUND, "function 'nope' is not defined", False)
    assert out == [
        ResumeWithResult(executor_id="e1", call_id=root, result=SubCallFailed(failure=failure))
    ]
    assert core.holding_call("e1") == root  # the parent runs again
    # From the wrong executor, or for a call no longer live: nothing.
    assert core.subcall_unresolved("e2", root, "x", 3) == []
    assert core.subcall_unresolved("e1", 999, "x", 3) == []


def test_an_io_answer_resumes_the_call_and_charges_its_io_time() -> None:
    core, root = one_root_on_e1()
    core.call_suspended("e1", root, 1)
    task_usage = core.usage("t1")
    assert core.io_answered("e1", root, 2, io_us=700) == [
        ResumeWithIo(executor_id="e1", call_id=root)
    ]
    assert task_usage.io_us == 700
    failure = Failure.of(IoErrorKind.UNAVAILABLE, "node down")
    core.call_suspended("e1", root, 3)
    assert core.io_answered("e1", root, 4, io_us=5, failure=failure) == [
        ResumeWithIo(executor_id="e1", call_id=root)
    ]
    assert core.io_answered("e2", root, 5, io_us=1) == []  # not the call's executor


def test_a_forbidden_write_fails_the_call_and_aborts_it_on_its_executor() -> None:
    core, root = one_root_on_e1()
    core.call_suspended("e1", root, 1)
    usage = core.usage("t1")
    refused = Failure.of(IoErrorKind.WRITE_FORBIDDEN, "functions are read-only")
    out = core.io_answered("e1", root, 2, io_us=100, failure=refused)
    assert usage.io_us == 0  # the refused write is not charged
    assert out[0] == AbortCall(
        executor_id="e1",
        call_id=root,
        failure=Failure(CallFailureKind.WRITE_FORBIDDEN, "functions are read-only", False),
    )
    converge = only_failure(out)
    assert converge.failed_call is not None
    assert converge.failed_call.kind is CallFailureKind.WRITE_FORBIDDEN
    assert core.io_answered("e1", root, 3, io_us=1, failure=refused) == []
