"""What the drivers do with a task's attempts, on top of the client's attempt book.

A task runs again under a NEW task_id of its lineage, after a back-off
(``blockx_client.attempts``: the book that judges attempts and the pump that runs
them, shared with ``Client.run_with_retries``). The block writers replace a
block's rows in one transaction, so running a block again after an attempt that
may have written it leaves the same rows.

A task a client cancelled (``blockx cancel``, ``Client.cancel``) fails CANCELLED,
not retryable: it is never resubmitted. A driver that stops before its attempts
under way have ended (an interruption, a stop after a failure) cancels them on
their Workers, best effort (``AttemptPump.aclose``).

For a driver, an attempt whose fate the client could not learn (a connection
refused or cut, no slot in time, the Worker no longer knowing the task) is worth
another attempt too (``run_attempt``). A request the cluster refuses as malformed
or misconfigured (``InvalidRequestError``, e.g. no bundle coordinator configured)
is raised: no attempt would fare better.

Attempts are bounded (``max_attempts``, at most ``MAX_ATTEMPTS_LIMIT``): a task
out of attempts, or failed with a failure that is not retryable, has failed for
good, and the driver goes on without it or stops, as ``OnFailure`` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgspec.structs import replace

from blockx_client.attempts import outcome_of_error
from blockx_client.errors import BlockxError, ConnectError, InvalidRequestError
from blockx_client.models import Task, TaskResult
from blockx_core.failures import ClientFailureCode, FailureCode
from blockx_drive.defaults import MAX_ATTEMPTS_LIMIT, OnFailure

if TYPE_CHECKING:
    from blockx_client import Client


class ClusterUnreachable(ConnectError):
    """A task used up its attempts without the client once learning its fate: the
    cluster is out of reach, and the other tasks would fare no better."""


def check_bounded(name: str, value: int, limit: int) -> None:
    """ValueError naming ``name`` unless ``value`` is a whole number from 1 to ``limit``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(f"{name} must be a whole number from 1 to {limit}, got {value!r}")


def check_attempts(max_attempts: int, on_failure: OnFailure | str) -> OnFailure:
    """``max_attempts`` and ``on_failure`` as a driver takes them; ValueError naming
    what is wrong."""
    check_bounded("max_attempts", max_attempts, MAX_ATTEMPTS_LIMIT)
    try:
        return OnFailure(on_failure)
    except ValueError:
        allowed = " or ".join(repr(o.value) for o in OnFailure)
        raise ValueError(f"on_failure must be {allowed}, got {on_failure!r}") from None


def cancelled_by_client(result: TaskResult) -> bool:
    """The attempt was cancelled by a client (CancelTask): FAILED, not retryable. A
    Worker's own shutdown cancels tasks retryably."""
    return result.failure_code == FailureCode.CANCELLED and not result.retryable


async def run_attempt(client: Client, task: Task) -> TaskResult:
    """Run one attempt of a driver's task; a transient client error comes back as a
    retryable result instead of an exception."""
    try:
        return await client.run(task)
    except InvalidRequestError:
        raise
    except BlockxError as exc:
        # Any other refusal of the client may pass: a later attempt is worth it.
        return replace(outcome_of_error(task.task_id, exc), retryable=True)


def out_of_reach(what: str, attempts: int, result: TaskResult) -> ClusterUnreachable:
    """The error ending a run whose task (``what``: its blocks) went unanswered."""
    return ClusterUnreachable(
        f"{what}: {attempts} attempts and the cluster never answered: "
        f"{result.failure_message or result.error}"
    )


def unanswered(result: TaskResult) -> bool:
    """The cluster never answered this attempt: the client's own failure, with
    nothing run (no slot, no coordinator, no worker taking the task)."""
    return isinstance(result.failure_code, ClientFailureCode) and not result.may_have_run
