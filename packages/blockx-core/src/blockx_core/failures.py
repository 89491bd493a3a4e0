"""Every way a BlockX operation fails, and whether trying again may help.

A failure has a *kind* from one of five enums, one per layer that decides it:

- ``FailureCode``: why a Worker failed a task (``TaskResult.failure_code``);
- ``ClientFailureCode``: why a client reports a task FAILED when no Worker did;
- ``CallFailureKind``: why one call attempt failed;
- ``IoErrorKind``: why one IO request failed (``IoError.kind`` in a function);
- ``PrecheckFailure``: why a function's precheck failed.

Whether a retry may help is decided once, in ``RETRYABLE``, for every kind side by
side. ``Failure`` carries a kind, a message for people and that verdict, from the
core to the server, the client and the CLI. A request refused before anything ran
is a ``blockx_core.errors.Refusal`` with an ``ErrorCode``, not a failure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, TypeAlias

import msgspec


class FailureCode(enum.StrEnum):
    """Why a task converged to FAILED (``TaskResult.executeResult.failureCode``)."""

    ACTIVATION_FAILED = "ACTIVATION_FAILED"
    IO_SCOPE_FAILED = "IO_SCOPE_FAILED"
    SLOT_LOST = "SLOT_LOST"
    BUILDER_NOT_FOUND = "BUILDER_NOT_FOUND"
    BUILDER_FAILED = "BUILDER_FAILED"
    CALL_FAILED = "CALL_FAILED"
    OUTPUT_BYTES_EXCEEDED = "OUTPUT_BYTES_EXCEEDED"
    PLUGIN_NOT_FOUND = "PLUGIN_NOT_FOUND"
    PLUGIN_FAILED = "PLUGIN_FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"
    WATCH_DISCONNECTED = "WATCH_DISCONNECTED"


class ClientFailureCode(enum.StrEnum):
    """Why the client reports a task FAILED when no Worker reported its end: the task
    could not be placed, or its Worker vanished. These share ``failure_code`` with
    the Worker's ``FailureCode`` and never collide with it."""

    # The Worker that accepted the task restarted and no longer knows it, or stayed
    # unreachable, or its Watch stream broke and it could not be asked again.
    WORKER_LOST = "WORKER_LOST"
    # No slot before the deadline: every worker stayed full (RESOURCE_EXHAUSTED).
    NO_SLOT = "NO_SLOT"
    # The coordinator could not be reached for as long as the client was allowed to try.
    COORDINATOR_UNREACHABLE = "COORDINATOR_UNREACHABLE"
    # The coordinator kept answering UNAVAILABLE (no live worker in its view).
    COORDINATOR_UNAVAILABLE = "COORDINATOR_UNAVAILABLE"
    # ABORTED with too little time left to wait one slot TTL.
    SLOT_UNCERTAIN = "SLOT_UNCERTAIN"
    # Every slot handed out was gone before SubmitTask (FAILED_PRECONDITION).
    SLOT_INVALID = "SLOT_INVALID"
    # The request is wrong (bad config, bad address, no coordinator configured for
    # the task's cluster): resubmitting it unchanged fails the same way.
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    # Any other answer the client cannot place a task through (the message has it).
    PLACEMENT_FAILED = "PLACEMENT_FAILED"


class CallFailureKind(enum.StrEnum):
    """Why one call attempt failed."""

    # The function raised (its type, message and traceback are in the message).
    USER_ERROR = "USER_ERROR"
    # The module does not compile or its top level raised.
    COMPILE_ERROR = "COMPILE_ERROR"
    FUNCTION_NOT_FOUND = "FUNCTION_NOT_FOUND"
    # The return value is not JSON-compatible data.
    BAD_RESULT = "BAD_RESULT"
    # CPU + IO time over CallDeadlineMs.
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    # The executor process died or was killed while the call was on it.
    EXECUTOR_LOST = "EXECUTOR_LOST"
    # An IO read failed and the function did not handle it.
    IO_ERROR = "IO_ERROR"
    # The function attempted a write; writes go through a Writer Plugin.
    WRITE_FORBIDDEN = "WRITE_FORBIDDEN"
    # The call's arguments (or a sub-call's, an IO request's) cannot be sent between
    # the Worker and an executor: an object with no msgpack type, a lone surrogate.
    BAD_ARGUMENTS = "BAD_ARGUMENTS"


class IoErrorKind(enum.StrEnum):
    """``IoError.kind`` as a function sees it."""

    UNKNOWN_BACKEND = "UNKNOWN_BACKEND"
    UNKNOWN_OP = "UNKNOWN_OP"
    BAD_REQUEST = "BAD_REQUEST"
    WRITE_FORBIDDEN = "WRITE_FORBIDDEN"
    UNAVAILABLE = "UNAVAILABLE"
    BAD_VALUE = "BAD_VALUE"
    # The backend does not know what was named (a block or transaction a node has not seen).
    NOT_FOUND = "NOT_FOUND"
    # A chain this process does not serve (or none named where several are served).
    UNKNOWN_CHAIN = "UNKNOWN_CHAIN"


class PrecheckFailure(enum.StrEnum):
    """Why a precheck failed; the first two are also call failure kinds."""

    FUNCTION_NOT_FOUND = "FUNCTION_NOT_FOUND"
    COMPILE_ERROR = "COMPILE_ERROR"
    SIGNATURE_MISMATCH = "SIGNATURE_MISMATCH"


FailureKind: TypeAlias = (
    FailureCode | ClientFailureCode | CallFailureKind | IoErrorKind | PrecheckFailure
)


# Whether trying again may help, per kind. ``None``: the failure itself decides
# (``Failure.retryable`` as its maker set it); every other kind is decided here.
# A kind spelled alike in two enums (WRITE_FORBIDDEN, FUNCTION_NOT_FOUND) is one key
# with one verdict: the enums are ``str``s, and tests/core/test_failures.py checks
# that no two spellings disagree.
RETRYABLE: Final[Mapping[FailureKind, bool | None]] = {
    # A task: resubmitting it under a new task_id.
    FailureCode.ACTIVATION_FAILED: True,
    FailureCode.IO_SCOPE_FAILED: True,
    FailureCode.SLOT_LOST: True,
    FailureCode.BUILDER_NOT_FOUND: False,
    FailureCode.BUILDER_FAILED: None,
    FailureCode.CALL_FAILED: False,
    FailureCode.OUTPUT_BYTES_EXCEEDED: False,
    FailureCode.PLUGIN_NOT_FOUND: False,
    FailureCode.PLUGIN_FAILED: None,
    # A phase cut short by the Worker's shutdown is retryable; a client's CancelTask
    # is not, and the Worker says so itself (``CANCELLED_BY_CLIENT``).
    FailureCode.CANCELLED: True,
    FailureCode.TIMED_OUT: True,
    FailureCode.WATCH_DISCONNECTED: False,
    # A task the client could not place or lost track of.
    ClientFailureCode.WORKER_LOST: True,
    ClientFailureCode.NO_SLOT: True,
    ClientFailureCode.COORDINATOR_UNREACHABLE: True,
    ClientFailureCode.COORDINATOR_UNAVAILABLE: True,
    ClientFailureCode.SLOT_UNCERTAIN: True,
    ClientFailureCode.SLOT_INVALID: True,
    ClientFailureCode.INVALID_ARGUMENT: False,
    # Decided by the gRPC status behind it.
    ClientFailureCode.PLACEMENT_FAILED: None,
    # A call attempt: calling again (CALL_RETRY_ON is a separate, operator choice).
    CallFailureKind.USER_ERROR: False,
    CallFailureKind.COMPILE_ERROR: False,
    CallFailureKind.FUNCTION_NOT_FOUND: False,
    CallFailureKind.BAD_RESULT: False,
    CallFailureKind.BUDGET_EXCEEDED: False,
    CallFailureKind.WRITE_FORBIDDEN: False,
    CallFailureKind.BAD_ARGUMENTS: False,
    # A new attempt gets a fresh executor process.
    CallFailureKind.EXECUTOR_LOST: True,
    # Backends fail transiently; an IO error that fails the same way every time
    # comes with its own ``retryable=False`` and overrides this.
    CallFailureKind.IO_ERROR: True,
    # An IO request: only a backend that could not answer may answer on a second
    # try; a request naming no backend, no operation or bad arguments fails alike.
    IoErrorKind.UNKNOWN_BACKEND: False,
    IoErrorKind.UNKNOWN_OP: False,
    IoErrorKind.BAD_REQUEST: False,
    IoErrorKind.WRITE_FORBIDDEN: False,
    IoErrorKind.UNAVAILABLE: True,
    IoErrorKind.BAD_VALUE: False,
    IoErrorKind.NOT_FOUND: False,
    IoErrorKind.UNKNOWN_CHAIN: False,
    # A precheck: the code itself is wrong until it changes.
    PrecheckFailure.SIGNATURE_MISMATCH: False,
}


def is_retryable(kind: FailureKind, *, otherwise: bool = False) -> bool:
    """The table's verdict for ``kind``; ``otherwise`` where the failure decides."""
    verdict = RETRYABLE[kind]
    return otherwise if verdict is None else verdict


class Failure(msgspec.Struct, frozen=True):
    """A failure as every layer hands it on: what kind, what to tell people, and
    whether trying again may help (``RETRYABLE`` unless the failure knew better)."""

    kind: FailureKind
    message: str
    retryable: bool

    @classmethod
    def of(cls, kind: FailureKind, message: str, *, retryable: bool | None = None) -> Failure:
        """A failure of ``kind``: retryable as the table says, or as ``retryable``
        says where the table leaves it to the failure, or to narrow it (a retryable
        kind whose cause cannot change is not retried)."""
        verdict = RETRYABLE[kind]
        if verdict is None:
            return cls(kind, message, bool(retryable))
        return cls(kind, message, verdict and (retryable is None or retryable))


def call_failure_kind(wire: str) -> CallFailureKind:
    """The kind an executor's failure frame names (``blockx_executor.protocol``
    spells its kinds as strings and depends on nothing); one this Worker does not
    know is the function's own error."""
    try:
        return CallFailureKind(wire)
    except ValueError:
        return CallFailureKind.USER_ERROR
