"""What the client raises. Task failures are not exceptions: they are results
(``run_many`` and ``run_with_retries`` report placement failures as results too).

``TaskInputDiffersError`` carries a ``SubmitAnswer`` and so lives beside it, in
``models``: this module imports no other of the client's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpclib.const import Status

from blockx_core.coordinator import PlacementExplanation, WorkerReason, describe_explanation

if TYPE_CHECKING:
    from blockx_client.setting import Setting

# A placement error's message names this many workers; ``worker_reasons`` has all sent.
MESSAGE_WORKERS = 5


class BlockxError(Exception):
    """Base of the client's errors. ``status`` is the gRPC status behind it, if any.
    ``placement`` is what a refused ReserveWorkerSlot said about each worker it
    considered (empty for every other error)."""

    def __init__(
        self,
        message: str,
        status: Status | None = None,
        *,
        placement: PlacementExplanation | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.placement = placement or PlacementExplanation()

    @property
    def worker_reasons(self) -> tuple[WorkerReason, ...]:
        """Per worker, why it was not placed on (``describe_reason`` puts it in words)."""
        return self.placement.workers


class InvalidRequestError(BlockxError):
    """INVALID_ARGUMENT: the request is wrong; retrying it unchanged will not help."""


class NoSlotError(BlockxError):
    """No worker had a free slot (RESOURCE_EXHAUSTED); ``worker_reasons`` says why
    for each worker. The client backs off on it until the caller's deadline, then
    raises one of the two subclasses below."""


class ClusterBusyError(NoSlotError):
    """The deadline passed and, at the last attempt, every worker was full (or
    answered NoSlot): the cluster works but has no capacity to spare."""


class SlotWaitTimeoutError(NoSlotError):
    """The deadline passed while waiting for a slot, and not because every worker
    was full: the last attempt's ``worker_reasons`` say what kept them out (stale
    heartbeats, red lines, open breakers, rejections)."""


class UnavailableError(BlockxError):
    """The service is not ready, draining, or its worker view is not trusted; or the
    call's deadline passed without an answer (DEADLINE_EXCEEDED, whether this
    client's timer or the server's saw it first)."""


class SlotUncertainError(BlockxError):
    """ABORTED: a worker may hold a slot for this task_id; retry with the same id after
    one slot TTL (the client does this itself unless the deadline is too close)."""


class SlotInvalidError(BlockxError):
    """FAILED_PRECONDITION: the slot expired, was used, or predates a worker restart."""


class ChainNotServedError(BlockxError):
    """FAILED_PRECONDITION from the Sync Invoker: it does not serve the chain asked
    for (or serves several and none was named); the message names the chains it
    serves. Another Sync Invoker, configured with the chain, would run the call."""


class TaskNotFoundError(BlockxError):
    """NOT_FOUND: the worker does not know the task, or its result has expired."""


class ConnectError(BlockxError):
    """A coordinator, worker, proxy, sync invoker or etcd could not be reached, or
    the connection was lost during the call. ``may_have_reached`` is False only when
    nothing can have reached the server (the connection was never made).
    ``setting`` is the address setting that named the peer, with where it came from
    (None: the peer's address came from the cluster, a Worker's say)."""

    def __init__(
        self,
        message: str,
        status: Status | None = None,
        *,
        may_have_reached: bool = True,
        setting: Setting | None = None,
    ) -> None:
        super().__init__(message, status)
        self.may_have_reached = may_have_reached
        self.setting = setting


class CoordinatorUnreachableError(ConnectError):
    """Placement gave up on a coordinator it could not reach for the whole time it
    was allowed to try (the caller's deadline, or ``RetryPolicy.unreachable_s``)."""


class SubmitUncertainError(ConnectError):
    """SubmitTask to ``worker_addr`` may have been accepted: the connection was lost,
    or the call timed out, after the request was sent. ``Client.run`` resolves it by
    asking the worker (GetTaskResult); ``place`` raises it."""

    def __init__(self, message: str, worker_addr: str) -> None:
        super().__init__(message)
        self.worker_addr = worker_addr


class FunctionError(BlockxError):
    """``function(...).call()`` ran and the function failed; ``kind`` says how."""

    def __init__(self, kind: str, message: str, *, retryable: bool, call_id: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.retryable = retryable
        self.call_id = call_id
        self.detail = message


class ResultTypeError(BlockxError):
    """A value asked for as a type (``call(..., result_type=T)``,
    ``result.outputs(T)``) does not fit it; ``value`` is the value as decoded."""

    def __init__(self, message: str, value: object) -> None:
        super().__init__(message)
        self.value = value


_BY_STATUS: dict[Status, type[BlockxError]] = {
    Status.INVALID_ARGUMENT: InvalidRequestError,
    Status.RESOURCE_EXHAUSTED: NoSlotError,
    Status.UNAVAILABLE: UnavailableError,
    # The server enforces the deadline the call carries: its DEADLINE_EXCEEDED is the
    # client's own timeout arriving first (transport.unary makes that one the same).
    Status.DEADLINE_EXCEEDED: UnavailableError,
    Status.ABORTED: SlotUncertainError,
    Status.FAILED_PRECONDITION: SlotInvalidError,
    Status.NOT_FOUND: TaskNotFoundError,
}


def error_for(
    status: Status, message: str, placement: PlacementExplanation | None = None
) -> BlockxError:
    text = f"{status.name}: {message}"
    if placement is not None and (placement.workers or placement.omitted):
        text += f" [{describe_workers(placement)}]"
    return _BY_STATUS.get(status, BlockxError)(text, status, placement=placement)


def describe_workers(placement: PlacementExplanation) -> str:
    """The first workers' reasons in words, as error messages show them."""
    return describe_explanation(placement, limit=MESSAGE_WORKERS)
