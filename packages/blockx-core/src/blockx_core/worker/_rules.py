"""The worker core's fixed rules: each phase's default failure, which failures count
against the Worker's health, and the wording of the refusals and failures it gives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from blockx_core.failures import FailureCode
from blockx_core.task import TaskResult, cancelled_by_client
from blockx_core.worker._slots import Slot
from blockx_core.worker._types import SlotState, TaskPhase

DEFAULT_FAILURE: Final[Mapping[TaskPhase, FailureCode]] = {
    TaskPhase.BUILDER: FailureCode.BUILDER_FAILED,
    TaskPhase.CALLS: FailureCode.CALL_FAILED,
    TaskPhase.WRITER: FailureCode.PLUGIN_FAILED,
}

NOT_FOUND: Final[Mapping[TaskPhase, FailureCode]] = {
    TaskPhase.BUILDER: FailureCode.BUILDER_NOT_FOUND,
    TaskPhase.WRITER: FailureCode.PLUGIN_NOT_FOUND,
}

# Failures that say something about this Worker's health (its errorRate), not about
# the task's input or code. CANCELLED counts only when the Worker cut the task short
# (its shutdown), not when a client cancelled it.
WORKER_FAULTS: Final = frozenset(
    {FailureCode.ACTIVATION_FAILED, FailureCode.IO_SCOPE_FAILED, FailureCode.CANCELLED}
)


def is_worker_fault(result: TaskResult) -> bool:
    """Whether a converged task's result counts against the Worker's health."""
    return result.failure_code in WORKER_FAULTS and not cancelled_by_client(result)


SLOT_LOST_TEXT: Final = "the slot's lease expired before the task was activated"


def why_invalid(slot: Slot | None, slot_id: str, task_id: str) -> str:
    """Why SubmitTask's ``slot_id`` does not admit ``task_id``."""
    if slot is None:
        return (
            f"slot {slot_id!r} does not exist on this worker (expired, already used, or "
            "issued before a restart): reserve a slot again"
        )
    if slot.task_id != task_id:
        return f"slot {slot_id!r} is reserved for another task, not {task_id!r}"
    if slot.state is SlotState.ALLOCATED:
        return f"slot {slot_id!r} has expired (its lease ended): reserve a slot again"
    return f"slot {slot_id!r} is {slot.state.value}, not ALLOCATED"


def timeout_text(timeout_ms: int) -> str:
    return f"the task did not finish within its timeout of {timeout_ms} ms"
