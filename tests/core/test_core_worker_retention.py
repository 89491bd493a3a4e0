"""WorkerCore's retained results under RESULT_RETENTION_MAX_BYTES: tombstones.

Tasks are driven through the core's public handlers to a SUCCEEDED result whose
one plugin result has a given number of bytes; ``now_ms`` is explicit. The table
tests fix which results stay and which become tombstones; the hypothesis machine
checks, over random sizes, resubmissions and time, that the retained bytes never
exceed the budget after a convergence and that no task id runs twice while its
result or its tombstone is kept.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from support import token

from blockx_core.errors import ErrorCode, InvalidConfig, Refusal
from blockx_core.failures import FailureCode
from blockx_core.task import PluginConfig, PluginResult, TaskInput, TaskResult, TaskState
from blockx_core.worker import (
    PhaseCrashed,
    PhaseSucceeded,
    PrepareTaskActivation,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
    WorkerConfig,
    WorkerCore,
    result_bytes,
)
from blockx_core.worker._retention import ENTRY_OVERHEAD_BYTES, input_digest

T0 = 1_000_000
RETENTION = 1_000
PLUGIN = "ReturnValueResultHandler"
CONFIG_TEXT = '{"function": "echo", "callList": [[1]]}'
DROPPED = "its outputs were dropped to keep retained results under RESULT_RETENTION_MAX_BYTES"


def make_core(max_bytes: int, *, tombstones: int = 100, slots: int = 4) -> WorkerCore:
    core = WorkerCore(
        WorkerConfig(
            task_slots=slots,
            result_retention_ms=RETENTION,
            result_retention_max_bytes=max_bytes,
            result_tombstones_max=tombstones,
        ),
        "inc",
    )
    core.set_ready(True)
    return core


def task_input(task_id: str, config: str = CONFIG_TEXT) -> TaskInput:
    return TaskInput(
        task_id=task_id,
        function_call_config=PluginConfig(type="CallListCallConfig", config=config),
        result_handler=PluginConfig(type=PLUGIN),
    )


def output(size: int) -> PluginResult:
    return PluginResult(plugin_name=PLUGIN, success=True, result=b"x" * size)


def run(core: WorkerCore, task_id: str, size: int, now: int) -> TaskConverged:
    """Submit ``task_id`` and drive it to SUCCEEDED with an output of ``size`` bytes."""
    answer = core.handle_submit_task(task_input(task_id), "", now)
    assert not isinstance(answer, Refusal), answer
    _, cmds = answer
    assert [type(c) for c in cmds] == [PrepareTaskActivation]
    core.handle_task_activation_prepared(task_id, token(core, task_id, TaskPhase.PREPARING), now)
    core.handle_task_phase_finished(
        task_id, token(core, task_id, TaskPhase.BUILDER), PhaseSucceeded(call_count=0), now
    )
    done = core.handle_task_phase_finished(
        task_id,
        token(core, task_id, TaskPhase.WRITER),
        PhaseSucceeded(plugin_results=(output(size),)),
        now,
    )
    assert len(done) == 1
    assert isinstance(done[0], TaskConverged)
    return done[0]


def cost(core: WorkerCore, converged: TaskConverged) -> int:
    return result_bytes(converged.task_id, converged.slot_id, converged.result)


def answer_of(core: WorkerCore, task_id: str, now: int) -> TaskSnapshot:
    got = core.handle_get_task_result(task_id, now)
    assert isinstance(got, TaskSnapshot), got
    return got


def test_the_defaults() -> None:
    cfg = WorkerConfig()
    assert (cfg.result_retention_max_bytes, cfg.result_tombstones_max) == (1 << 30, 100_000)


@pytest.mark.parametrize("field", ["result_retention_max_bytes", "result_tombstones_max"])
def test_a_budget_below_one_is_refused(field: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        WorkerConfig(**{field: 0}).validate()
    assert info.value.field == field


def test_result_bytes_counts_outputs_messages_and_names() -> None:
    result = TaskResult(success=False, failure_message="abc", plugin_results=(output(10),))
    assert result_bytes("t1", "s-1", result) == ENTRY_OVERHEAD_BYTES + 2 + 3 + 3 + 10 + len(PLUGIN)


# Budgets in units of one 1,000-byte result's cost (all task ids have the same length).
BUDGET_CASES = [
    # (results that fit in the budget, sizes of the tasks in convergence order,
    #  the task indexes left with their outputs)
    (3, [1_000, 1_000, 1_000], [0, 1, 2]),
    (2, [1_000, 1_000, 1_000], [1, 2]),
    (1, [1_000, 1_000, 1_000], [2]),
    (2, [1_000, 1_000, 1_000, 1_000, 1_000], [3, 4]),
    # One larger than the whole budget is a tombstone at once; the others stay.
    (2, [1_000, 100_000, 1_000], [0, 2]),
    # A larger one pushes out as many of the oldest as it needs.
    (3, [1_000, 1_000, 1_000, 2_000], [2, 3]),
]


@pytest.mark.parametrize(("fit", "sizes", "kept"), BUDGET_CASES)
def test_the_oldest_results_become_tombstones(fit: int, sizes: list[int], kept: list[int]) -> None:
    probe = make_core(1 << 30)
    unit = cost(probe, run(probe, "t0", 1_000, T0))
    core = make_core(fit * unit)
    results = [run(core, f"t{i}", size, T0 + i) for i, size in enumerate(sizes)]
    now = T0 + len(sizes)
    stats = core.retention_stats()
    assert stats.retained_bytes <= fit * unit
    assert stats.retained_bytes == sum(cost(core, results[i]) for i in kept)
    assert (stats.results, stats.tombstones) == (len(kept), len(sizes) - len(kept))
    assert stats.dropped == len(sizes) - len(kept)
    for i, converged in enumerate(results):
        got = answer_of(core, f"t{i}", now)
        if i in kept:
            assert got == TaskSnapshot(
                task_id=f"t{i}",
                slot_id=converged.slot_id,
                state=TaskState.SUCCEEDED,
                result=converged.result,
            )
        else:
            assert got.outputs_dropped
            assert got.state is TaskState.SUCCEEDED


def test_a_tombstone_answers_the_state_and_says_the_outputs_were_dropped() -> None:
    core = make_core(1)  # nothing fits: every result is a tombstone at once
    converged = run(core, "t1", 100, T0)
    got = answer_of(core, "t1", T0 + 1)
    assert (got.task_id, got.slot_id, got.state, got.outputs_dropped) == (
        "t1",
        converged.slot_id,
        TaskState.SUCCEEDED,
        True,
    )
    assert got.result is not None
    assert got.result.success
    assert got.result.failure_code is None
    assert got.result.plugin_results == (PluginResult(plugin_name=PLUGIN, success=True),)
    assert DROPPED in got.result.failure_message
    assert input_digest(task_input("t1")) in got.result.failure_message


def test_a_failed_tombstone_keeps_its_code_retryability_and_message() -> None:
    core = make_core(1)
    core.handle_submit_task(task_input("t1"), "", T0)
    core.handle_task_activation_prepared("t1", token(core, "t1", TaskPhase.PREPARING), T0)
    core.handle_task_phase_finished(
        "t1",
        token(core, "t1", TaskPhase.BUILDER),
        PhaseCrashed(message="the read failed"),
        T0,
    )
    got = answer_of(core, "t1", T0 + 1)
    assert got.state is TaskState.FAILED
    assert got.result is not None
    assert (got.result.success, got.result.failure_code, got.result.retryable) == (
        False,
        FailureCode.BUILDER_FAILED,
        True,
    )
    assert got.result.failure_message.startswith("the read failed; " + DROPPED)


@pytest.mark.parametrize("how", ["submit", "request"])
def test_a_tombstoned_task_id_is_not_run_again(how: str) -> None:
    core = make_core(1)
    run(core, "t1", 100, T0)
    if how == "submit":
        answer = core.handle_submit_task(task_input("t1"), "", T0 + 10)
        assert not isinstance(answer, Refusal), answer
        snapshot, cmds = answer
        assert cmds == []
    else:
        got = core.handle_request_task_slot("t1", 1_000, T0 + 10)
        assert isinstance(got, TaskSnapshot), got
        snapshot = got
    assert snapshot.state is TaskState.SUCCEEDED
    assert snapshot.outputs_dropped
    assert core.derive_heartbeat() == (4, 0, 0)


def test_a_tombstone_expires_with_the_retention() -> None:
    core = make_core(1)
    run(core, "t1", 100, T0)
    assert core.next_deadline_ms() == T0 + RETENTION
    assert answer_of(core, "t1", T0 + RETENTION - 1).outputs_dropped
    core.tick_timers(T0 + RETENTION)
    got = core.handle_get_task_result("t1", T0 + RETENTION)
    assert isinstance(got, Refusal)
    assert got.code is ErrorCode.NOT_FOUND
    assert core.retention_stats().tombstones == 0
    # After the retention the task id may run again, as for any expired result.
    run(core, "t1", 100, T0 + RETENTION)


def test_tombstones_are_bounded_oldest_first() -> None:
    core = make_core(1, tombstones=2)
    for i in range(3):
        run(core, f"t{i}", 100, T0 + i)
    assert core.retention_stats().tombstones == 2
    assert isinstance(core.handle_get_task_result("t0", T0 + 3), Refusal)
    assert answer_of(core, "t1", T0 + 3).outputs_dropped
    assert answer_of(core, "t2", T0 + 3).outputs_dropped


def test_an_expired_result_frees_its_bytes_before_a_live_one_is_dropped() -> None:
    probe = make_core(1 << 30)
    unit = cost(probe, run(probe, "t0", 1_000, T0))
    core = make_core(unit)
    run(core, "t0", 1_000, T0)
    # t0's retention has ended (not yet purged): t1 takes its room, no tombstone.
    run(core, "t1", 1_000, T0 + RETENTION)
    assert core.retention_stats().tombstones == 0
    assert not answer_of(core, "t1", T0 + RETENTION).outputs_dropped


def test_the_digest_covers_builder_writer_and_configs() -> None:
    base = task_input("t1")
    variants = [
        task_input("t1", '{"function": "echo", "callList": [[2]]}'),
        TaskInput(task_id="t1", function_call_config=base.function_call_config),
        TaskInput(
            task_id="t1",
            function_call_config=PluginConfig(type="InputsCallConfig", config=CONFIG_TEXT),
            result_handler=base.result_handler,
        ),
    ]
    digests = {input_digest(base), *(input_digest(v) for v in variants)}
    assert len(digests) == 4
    # The task id is not part of what ran.
    assert input_digest(task_input("other")) == input_digest(base)


# ---- random interleavings ----------------------------------------------------------------

TASK_IDS = ("a", "b", "c", "d", "e")


class RetentionMachine(RuleBasedStateMachine):
    """Tasks converge with random output sizes; time moves with or without a tick.

    The model remembers, per task id, the result it converged with and the end of
    its retention; tombstones are never forgotten for their count here (the bound
    is larger than the task ids), so the core must answer every task id within its
    retention with that result or its tombstone, and never run it again."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = 1
        self.core = make_core(1)
        self.now = T0
        self.ran: dict[str, tuple[TaskConverged, int]] = {}
        self.order: list[str] = []  # convergence order of the live entries
        self.runs: dict[str, int] = {}

    @initialize(results=st.integers(min_value=0, max_value=4))
    def setup(self, results: int) -> None:
        probe = make_core(1 << 30)
        unit = cost(probe, run(probe, "a", 1_000, T0))
        self.budget = max(1, results * unit)
        self.core = make_core(self.budget, tombstones=len(TASK_IDS), slots=len(TASK_IDS))

    def _live(self, task_id: str) -> bool:
        entry = self.ran.get(task_id)
        return entry is not None and entry[1] > self.now

    @rule(task_id=st.sampled_from(TASK_IDS), size=st.sampled_from([0, 500, 1_000, 3_000, 10**5]))
    def submit(self, task_id: str, size: int) -> None:
        answer = self.core.handle_submit_task(task_input(task_id), "", self.now)
        assert not isinstance(answer, Refusal), answer
        snapshot, cmds = answer
        if self._live(task_id):
            # Retained or tombstoned: the same terminal state, never a second run.
            assert cmds == []
            assert snapshot.state is TaskState.SUCCEEDED
            return
        assert [type(c) for c in cmds] == [PrepareTaskActivation]
        self.runs[task_id] = self.runs.get(task_id, 0) + 1
        self.core.handle_task_activation_prepared(
            task_id, token(self.core, task_id, TaskPhase.PREPARING), self.now
        )
        self.core.handle_task_phase_finished(
            task_id,
            token(self.core, task_id, TaskPhase.BUILDER),
            PhaseSucceeded(call_count=0),
            self.now,
        )
        done = self.core.handle_task_phase_finished(
            task_id,
            token(self.core, task_id, TaskPhase.WRITER),
            PhaseSucceeded(plugin_results=(output(size),)),
            self.now,
        )
        assert isinstance(done[0], TaskConverged)
        self.ran[task_id] = (done[0], self.now + RETENTION)
        self.order = [t for t in self.order if t != task_id and self._live(t)] + [task_id]
        assert self.core.retention_stats().retained_bytes <= self.budget

    @rule(dt=st.integers(min_value=0, max_value=400), tick=st.booleans())
    def advance(self, dt: int, tick: bool) -> None:
        self.now += dt
        if tick:
            self.core.tick_timers(self.now)

    @invariant()
    def within_the_budget(self) -> None:
        stats = self.core.retention_stats()
        assert stats.retained_bytes <= self.budget
        assert stats.tombstones <= len(TASK_IDS)

    @invariant()
    def every_live_task_answers_its_result_or_its_tombstone(self) -> None:
        full: list[str] = []
        for task_id in TASK_IDS:
            got = self.core.handle_get_task_result(task_id, self.now)
            if not self._live(task_id):
                assert isinstance(got, Refusal), got
                continue
            converged, _ = self.ran[task_id]
            assert isinstance(got, TaskSnapshot), got
            assert (got.slot_id, got.state) == (converged.slot_id, TaskState.SUCCEEDED)
            if got.outputs_dropped:
                assert got.result is not None
                assert DROPPED in got.result.failure_message
                assert all(not p.result for p in got.result.plugin_results)
            else:
                assert got.result == converged.result
                full.append(task_id)
        # The oldest go first: a kept result is older than another only when that
        # other is kept too, or would not fit the budget on its own.
        live = [t for t in self.order if self._live(t)]
        for i, task_id in enumerate(live):
            if task_id in full:
                for newer in live[i + 1 :]:
                    converged, _ = self.ran[newer]
                    assert newer in full or cost(self.core, converged) > self.budget


RetentionMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestRetentionStateful = RetentionMachine.TestCase
