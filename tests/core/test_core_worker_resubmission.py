"""A resubmitted task_id whose input differs: WorkerCore answers the stable state of
the task that ran (running, retained or a tombstone), and ``input_differs`` says
that the input differs."""

from __future__ import annotations

from support import token

from blockx_core.errors import Refusal
from blockx_core.task import PluginConfig, PluginResult, TaskInput, TaskState
from blockx_core.worker import (
    PhaseSucceeded,
    PrepareTaskActivation,
    TaskPhase,
    TaskSnapshot,
    WorkerConfig,
    WorkerCore,
)

T0 = 1_000_000
CALLS_A = '{"function": "echo", "callList": [["a"]]}'
CALLS_B = '{"function": "echo", "callList": [["b"]]}'


def make_core(max_bytes: int = 1 << 20) -> WorkerCore:
    core = WorkerCore(
        WorkerConfig(task_slots=2, result_retention_ms=1000, result_retention_max_bytes=max_bytes),
        "inc",
    )
    core.set_ready(True)
    return core


def task(config: str, handler: str = "ReturnValueResultHandler") -> TaskInput:
    return TaskInput(
        task_id="t1",
        function_call_config=PluginConfig(type="CallListCallConfig", config=config),
        result_handler=PluginConfig(type=handler),
    )


class Answer:
    """What SubmitTask answers: the snapshot and the input_differs flag."""

    def __init__(self, snapshot: TaskSnapshot, input_differs: bool) -> None:
        self.snapshot = snapshot
        self.state = snapshot.state
        self.result = snapshot.result
        self.outputs_dropped = snapshot.outputs_dropped
        self.input_differs = input_differs


def submit(core: WorkerCore, task_input: TaskInput, now: int = T0) -> Answer:
    answer = core.handle_submit_task(task_input, "", now)
    assert not isinstance(answer, Refusal), answer
    return Answer(answer[0], core.input_differs(task_input, now))


def finish(core: WorkerCore, size: int = 10) -> None:
    core.handle_task_activation_prepared("t1", token(core, "t1", TaskPhase.PREPARING), T0)
    core.handle_task_phase_finished(
        "t1", token(core, "t1", TaskPhase.BUILDER), PhaseSucceeded(call_count=0), T0
    )
    output = PluginResult(plugin_name="ReturnValueResultHandler", success=True, result=b"x" * size)
    core.handle_task_phase_finished(
        "t1", token(core, "t1", TaskPhase.WRITER), PhaseSucceeded(plugin_results=(output,)), T0
    )


def test_a_running_task_flags_another_input() -> None:
    core = make_core()
    first = task(CALLS_A)
    answer = core.handle_submit_task(first, "", T0)
    assert not isinstance(answer, Refusal)
    assert [type(c) for c in answer[1]] == [PrepareTaskActivation]
    assert core.input_differs(first, T0) is False  # the submission that started it
    assert submit(core, task(CALLS_A)).input_differs is False
    other = submit(core, task(CALLS_B))
    assert (other.state, other.input_differs) == (TaskState.RUNNING, True)
    assert submit(core, task(CALLS_A, handler="")).input_differs is True
    assert core.input_differs(task(CALLS_B), T0) is True


def test_a_retained_result_flags_another_input_and_keeps_its_answer() -> None:
    core = make_core()
    submit(core, task(CALLS_A))
    finish(core)
    same = submit(core, task(CALLS_A), T0 + 1)
    other = submit(core, task(CALLS_B), T0 + 1)
    assert same.input_differs is False
    assert other.input_differs is True
    assert other.state is TaskState.SUCCEEDED
    assert other.result == same.result
    assert other.snapshot == same.snapshot  # the answer itself is the stable state
    # After retention, the id is free: a new run, nothing to compare with.
    fresh = submit(core, task(CALLS_B), T0 + 5000)
    assert (fresh.state, fresh.input_differs) == (TaskState.RUNNING, False)


def test_a_tombstone_flags_another_input() -> None:
    core = make_core(max_bytes=100)  # the result does not fit: a tombstone at once
    submit(core, task(CALLS_A))
    finish(core, size=1000)
    same = submit(core, task(CALLS_A), T0 + 1)
    other = submit(core, task(CALLS_B), T0 + 1)
    assert (same.outputs_dropped, same.input_differs) == (True, False)
    assert (other.outputs_dropped, other.input_differs) == (True, True)
