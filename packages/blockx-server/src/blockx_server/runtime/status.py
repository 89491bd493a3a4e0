"""ErrorCode <-> gRPC status, in one place for every service.

The Coordinator's classification of a Worker's answer (``classify_worker_status``)
must stay the inverse of the Worker's admission mapping (``WORKER_ADMISSION_STATUS``): a status
the Worker uses for a definite rejection must never be read as "may have
allocated", and vice versa. What a definite answer then means for the Worker
(backpressure, the request's fault, or a rejection that counts toward its breaker)
is the core's table, ``blockx_core.coordinator.classify_slot_answer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_core.errors import ErrorCode

# How a Worker answers an admission error (RequestTaskSlot, SubmitTask): the codes
# the Coordinator's classification below inverts.
WORKER_ADMISSION_STATUS: Final[Mapping[ErrorCode, Status]] = {
    ErrorCode.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
    ErrorCode.NO_SLOT: Status.RESOURCE_EXHAUSTED,
    ErrorCode.INVALID_SLOT: Status.FAILED_PRECONDITION,
    ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
    ErrorCode.NOT_FOUND: Status.NOT_FOUND,
}

# How a Worker answers any refusal (worker.v1): admission's, and CancelTask's of a
# task reserved but not submitted, which is in no state to be cancelled (nothing
# runs) and may still be submitted. RequestTaskSlot never answers it, so the
# Coordinator never has to tell it from INVALID_SLOT.
WORKER_STATUS: Final[Mapping[ErrorCode, Status]] = {
    **WORKER_ADMISSION_STATUS,
    ErrorCode.NOT_SUBMITTED: Status.FAILED_PRECONDITION,
}

# How a Coordinator answers ReserveWorkerSlot.
COORDINATOR_STATUS: Final[Mapping[ErrorCode, Status]] = {
    ErrorCode.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
    ErrorCode.NO_EXECUTABLE_SLOT: Status.RESOURCE_EXHAUSTED,
    ErrorCode.SLOT_UNCERTAIN: Status.ABORTED,
}

# How the Sync Invoker refuses a request (the request did not run).
SYNC_INVOKER_STATUS: Final[Mapping[ErrorCode, Status]] = {
    ErrorCode.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
    # Every invoke slot (SYNC_INVOKER_MAX_CONCURRENT) is taken: back off and retry.
    ErrorCode.NO_SLOT: Status.RESOURCE_EXHAUSTED,
    # A chain this Sync Invoker does not serve (or none named where it serves
    # several): the request is well formed, and another deployment of the same
    # request (one serving the chain) would run it, so it is the server's state that
    # refuses it, not the argument; retrying here changes nothing.
    ErrorCode.CHAIN_NOT_SERVED: Status.FAILED_PRECONDITION,
}

# Statuses that prove the Worker did not allocate a slot (a definite rejection).
_DEFINITE: Final[Mapping[Status, ErrorCode]] = {
    **{status: code for code, status in WORKER_ADMISSION_STATUS.items()},
    # The handler never ran: the address does not serve worker.v1 or refused us.
    Status.UNIMPLEMENTED: ErrorCode.REJECTED,
    Status.PERMISSION_DENIED: ErrorCode.REJECTED,
    Status.UNAUTHENTICATED: ErrorCode.REJECTED,
}


def classify_worker_status(status: Status) -> tuple[ErrorCode, bool]:
    """``(code, may_have_allocated)`` for a gRPC status a Worker answered with.

    DEADLINE_EXCEEDED, CANCELLED, ABORTED, INTERNAL, UNKNOWN and anything not
    known to be a rejection may have reached the slot table: retry the same
    Worker with the same task_id, never switch.
    """
    code = _DEFINITE.get(status)
    if code is not None:
        return code, False
    return ErrorCode.SLOT_UNCERTAIN, True


# A status message travels in the grpc-message trailer, over whose size a client
# drops the connection (grpclib: 64 KiB of headers): a message quoting a request's
# field (a 70,000-character name) is cut short, saying how long it was.
MAX_STATUS_MESSAGE_CHARS: Final = 2000


def status_error(status: Status, message: str) -> GRPCError:
    """The error a servicer raises to answer ``status`` with ``message``, bounded."""
    if len(message) > MAX_STATUS_MESSAGE_CHARS:
        message = message[:MAX_STATUS_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return GRPCError(status, message)
