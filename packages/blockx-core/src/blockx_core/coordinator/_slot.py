"""What a Worker answered to one RequestTaskSlot, and how the Coordinator reads it.

The adapter that performs the RPC turns every way a call can end into one of
these values; the reservation core decides what each one means.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import msgspec

from blockx_core.errors import ErrorCode, Refusal
from blockx_core.ids import SlotId


class SlotGranted(msgspec.Struct, frozen=True):
    """The Worker answered RequestTaskSlot. An empty slot_id is not a grant."""

    slot_id: SlotId
    lease_deadline_ms: int = 0


class SlotError(Refusal, frozen=True):
    """RequestTaskSlot failed. ``may_have_allocated`` says whether the request may
    have reached the Worker's slot table: if so, only the same Worker may be asked
    again (with the same task_id), or one task could end up holding two slots.
    ``reached`` is False when no connection was made (the placement explanation
    says "unreachable" rather than "answered")."""

    may_have_allocated: bool
    reached: bool = True


SlotAnswer = SlotGranted | SlotError


class SlotAttemptResult(enum.StrEnum):
    """How one RequestTaskSlot to a worker ended (the metrics label)."""

    GRANTED = "granted"
    BACKPRESSURE = "no_slot"
    REJECTED = "rejected"
    # The Worker found the request itself invalid (INVALID_ARGUMENT).
    INVALID = "invalid"
    UNCERTAIN = "uncertain"


# What a definite refusal says, by its code; any code not listed is the Worker's
# own failure (REJECTED: a penalty, and the breaker after enough of them).
_REFUSALS: Final[Mapping[ErrorCode, SlotAttemptResult]] = {
    # NoSlot is the Worker working as intended: no penalty, no breaker.
    ErrorCode.NO_SLOT: SlotAttemptResult.BACKPRESSURE,
    # The request's fault, not the Worker's (a ttl_ms above its MAX_SLOT_TTL_MS): no
    # penalty, no breaker, and no other Worker is asked.
    ErrorCode.INVALID_ARGUMENT: SlotAttemptResult.INVALID,
}


def classify_slot_answer(answer: SlotAnswer) -> SlotAttemptResult:
    """Granted only with a slot_id; anything that may have allocated is uncertain;
    a definite refusal as its code says (``_REFUSALS``)."""
    if isinstance(answer, SlotGranted):
        return SlotAttemptResult.GRANTED if answer.slot_id else SlotAttemptResult.UNCERTAIN
    if answer.may_have_allocated:
        return SlotAttemptResult.UNCERTAIN
    return _REFUSALS.get(answer.code, SlotAttemptResult.REJECTED)


def describe_slot_answer(answer: SlotAnswer) -> str:
    """The answer in words, for logs and the final refusal's message."""
    if isinstance(answer, SlotGranted):
        if answer.slot_id:
            return f"granted {answer.slot_id}"
        return "the worker answered without a slot_id"
    return answer.message
