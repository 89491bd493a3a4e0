"""blockx_proto's betterproto2 field defaults without ``catch_warnings``: no default
of any generated message warns, and every message encodes to the same bytes and
has the same truth value as with betterproto2's own ``_get_field_default``."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator

import betterproto2
import pytest

from blockx_proto import _defaults, bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1


def _message_types() -> Iterator[type[betterproto2.Message]]:
    for module in (worker_v1, coordinator_v1, bundlecoordinator_v1, syncinvoker_v1):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, betterproto2.Message) and value is not betterproto2.Message:
                yield value


def test_no_default_of_a_generated_message_warns() -> None:
    types = list(_message_types())
    assert len(types) > 20
    for message_type in types:
        message = message_type()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name in message._betterproto.default_gen:  # type: ignore[arg-type]
                message._get_field_default(name)
        assert caught == [], message_type.__name__


def _samples() -> list[betterproto2.Message]:
    failure = worker_v1.CallFailureSummary(root_index=3, function="f", message="boom", attempt=2)
    result = worker_v1.TaskResult(
        success=True,
        execute_result=worker_v1.ExecuteResult(
            failure_code="CALL_FAILED",
            failure_message="m",
            retryable=True,
            call_failures=[failure, worker_v1.CallFailureSummary()],
        ),
    )
    return [
        worker_v1.TaskResult(),
        worker_v1.TaskResult(execute_result=worker_v1.ExecuteResult()),
        result,
        worker_v1.TaskUpdate(task_id="t", state=worker_v1.TaskState.RUNNING, is_terminal=False),
        worker_v1.TaskUpdate(task_id="t", is_terminal=True, result=result, timestamp_ms=-5),
        worker_v1.SubmitTaskRequest(
            task=worker_v1.TaskInput(
                task_id="t",
                function_call_config=worker_v1.FunctionCallConfig(type="x", config="{}"),
            ),
            slot_id="s",
        ),
        worker_v1.WatchTasksRequest(task_ids=["a", "b", ""], progress=True),
        worker_v1.WatchTasksRequest(task_ids=[]),
        coordinator_v1.ReserveWorkerSlotRequest(task_id="t"),
        coordinator_v1.ReserveWorkerSlotResponse(),
        *(message_type() for message_type in _message_types()),
    ]


def test_bytes_and_truth_are_betterproto2s(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _samples()
    ours = [(bytes(m), bool(m)) for m in samples]
    monkeypatch.setattr(
        betterproto2.Message, "_get_field_default", _defaults.ORIGINAL_FIELD_DEFAULT
    )
    theirs = [(bytes(m), bool(m)) for m in samples]
    assert ours == theirs
    assert (b"", False) in ours  # the empty messages
    assert any(truth for _, truth in ours)
