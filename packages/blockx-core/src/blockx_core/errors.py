"""Error codes shared by every BlockX component.

Expected outcomes (no slot, no candidate, invalid slot) are values carrying an
``ErrorCode``; exceptions are reserved for misuse of an API.
"""

from __future__ import annotations

import enum

import msgspec


class ErrorCode(enum.StrEnum):
    """Business error codes (``commontypes.ErrorCode`` in the Go implementation).

    The gRPC status of each code is decided in one table in ``blockx_server``.
    """

    INVALID_ARGUMENT = "InvalidArgument"
    UNAVAILABLE = "Unavailable"
    # Coordinator: a trusted view has no worker with free capacity.
    NO_EXECUTABLE_SLOT = "NoExecutableSlot"
    # Coordinator: a worker may hold a slot for the task; wait one slot TTL.
    SLOT_UNCERTAIN = "SlotUncertain"
    # Worker: no free slot in the local slot table.
    NO_SLOT = "NoSlot"
    # Worker: slot_id unknown, not ALLOCATED, or bound to another task.
    INVALID_SLOT = "InvalidSlot"
    NOT_FOUND = "NotFound"
    # Worker: CancelTask of a task that is reserved but not submitted (nothing runs).
    NOT_SUBMITTED = "NotSubmitted"
    # A worker refused a request for a reason other than capacity (e.g. the address
    # does not serve worker.v1): the request definitely did not allocate a slot.
    REJECTED = "Rejected"
    INTERNAL = "Internal"
    # Sync Invoker: the request names a chain it does not serve, or none where it
    # serves several; the request is well formed, this server cannot run it.
    CHAIN_NOT_SERVED = "ChainNotServed"


class Refusal(msgspec.Struct, frozen=True):
    """An expected "no" to a request: a code for programs and a message for people.

    Every component refuses with this shape (a Worker's admission, a Coordinator's
    selection, a slot reservation); a refusal that needs more says so in a subclass.
    """

    code: ErrorCode
    message: str


class BlockxUsageError(Exception):
    """A caller broke an API contract (a bug in the caller, not a runtime outcome)."""


class InvalidConfig(BlockxUsageError):
    """A configuration value breaks a rule. ``field`` names the offending field."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field} {rule}")
        self.field = field
        self.rule = rule
