"""A task's outcome when no Worker reported its end: the client's own results.

``run_many`` and ``run_with_retries`` never lose a task to an exception: a task
that could not be placed becomes a FAILED ``TaskResult`` whose ``failure_code``
(a ``ClientFailureCode``) says why and whose ``retryable`` says whether a
resubmission under a new task_id may help; a task whose Worker vanished after
accepting it is WORKER_LOST, retryable, ``may_have_run=True``.
"""

from __future__ import annotations

from typing import Final

from grpclib.const import Status

from blockx_client.errors import (
    BlockxError,
    ConnectError,
    CoordinatorUnreachableError,
    InvalidRequestError,
    NoSlotError,
    SlotInvalidError,
    SlotUncertainError,
    SubmitUncertainError,
    UnavailableError,
)
from blockx_client.models import TaskResult, TaskState
from blockx_core.failures import ClientFailureCode, is_retryable

# The most specific class first: the first match decides the code.
_BY_ERROR: Final[tuple[tuple[type[BlockxError], ClientFailureCode], ...]] = (
    (SubmitUncertainError, ClientFailureCode.WORKER_LOST),
    (CoordinatorUnreachableError, ClientFailureCode.COORDINATOR_UNREACHABLE),
    # A worker that refused SubmitTask's connection on every attempt.
    (ConnectError, ClientFailureCode.WORKER_LOST),
    (InvalidRequestError, ClientFailureCode.INVALID_ARGUMENT),
    (NoSlotError, ClientFailureCode.NO_SLOT),
    (UnavailableError, ClientFailureCode.COORDINATOR_UNAVAILABLE),
    (SlotUncertainError, ClientFailureCode.SLOT_UNCERTAIN),
    (SlotInvalidError, ClientFailureCode.SLOT_INVALID),
)

# Statuses behind PLACEMENT_FAILED that a later attempt may not meet again.
_TRANSIENT_STATUSES: Final = frozenset(
    {Status.UNKNOWN, Status.INTERNAL, Status.DEADLINE_EXCEEDED, Status.CANCELLED}
)


def client_failure(
    task_id: str,
    code: ClientFailureCode,
    message: str,
    *,
    retryable: bool,
    may_have_run: bool,
    worker_addr: str = "",
) -> TaskResult:
    return TaskResult(
        task_id=task_id,
        state=TaskState.FAILED,
        worker_addr=worker_addr,
        failure_code=code,
        failure_message=message,
        retryable=retryable,
        may_have_run=may_have_run,
    )


def worker_lost(task_id: str, worker_addr: str, why: str) -> TaskResult:
    """A task the Worker accepted and then lost track of (restart, unreachable)."""
    return client_failure(
        task_id,
        ClientFailureCode.WORKER_LOST,
        f"worker {worker_addr} lost task {task_id}: {why}",
        retryable=True,
        may_have_run=True,
        worker_addr=worker_addr,
    )


def outcome_of_error(task_id: str, exc: Exception) -> TaskResult:
    """The result for a task whose run ended in ``exc`` instead of a Worker result."""
    if isinstance(exc, SubmitUncertainError):
        return worker_lost(task_id, exc.worker_addr, exc.message)
    if not isinstance(exc, BlockxError):
        # A bug in the client, not an answer of the cluster: report it as it is, not
        # as retryable, and without claiming that nothing ran.
        return client_failure(
            task_id,
            ClientFailureCode.PLACEMENT_FAILED,
            f"the client failed: {type(exc).__name__}: {exc}",
            retryable=False,
            may_have_run=True,
        )
    code = next(
        (c for kind, c in _BY_ERROR if isinstance(exc, kind)), ClientFailureCode.PLACEMENT_FAILED
    )
    retryable = is_retryable(code, otherwise=exc.status in _TRANSIENT_STATUSES)
    return client_failure(
        task_id,
        code,
        f"placement failed: {exc.message}",
        retryable=retryable,
        may_have_run=False,
    )
