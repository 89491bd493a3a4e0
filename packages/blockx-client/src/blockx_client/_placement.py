"""Placement: ReserveWorkerSlot with back-off, then SubmitTask to the slot's worker.

The back-off follows what each attempt met, with the numbers in ``RetryPolicy``:

* RESOURCE_EXHAUSTED (no slot): jittered exponential back-off until the deadline.
* UNAVAILABLE (the coordinator is not ready): one immediate retry, then back-off,
  until the caller's deadline (at most ``unavailable_attempts`` in a row without one).
* a coordinator that cannot be reached (refused, reset, a stream cut): retried the
  same way for as long as the caller's deadline allows (``unreachable_s`` without
  one), then ``CoordinatorUnreachableError`` says for how long it was tried.
* ABORTED (a worker may hold a slot for this task_id): wait one slot TTL, ask again.

On SubmitTask, FAILED_PRECONDITION (the slot expired, or the worker restarted),
UNAVAILABLE (the worker is not ready or drains) and a refused connection reserve
again; a connection lost after the request was sent raises
``SubmitUncertainError``, since the worker may have accepted the task. The task_id
is the idempotency key throughout.

A refused ReserveWorkerSlot carries the coordinator's placement explanation
(``blockx-placement-bin`` trailing metadata): the error keeps it as
``worker_reasons``. At the deadline, RESOURCE_EXHAUSTED ends in
``ClusterBusyError`` when every worker was full and ``SlotWaitTimeoutError``
otherwise. Each back-off is reported to the ``PlacementListener`` installed with
``listen_to_placement`` (the CLI's "waiting for a slot" line).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Final, Protocol, TypeVar

import betterproto2
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from blockx_client._options import ClientOptions
from blockx_client._worker_rpc import WorkerRpc
from blockx_client.errors import (
    BlockxError,
    ClusterBusyError,
    ConnectError,
    CoordinatorUnreachableError,
    InvalidRequestError,
    NoSlotError,
    SlotInvalidError,
    SlotUncertainError,
    SlotWaitTimeoutError,
    SubmitUncertainError,
    UnavailableError,
    describe_workers,
    error_for,
)
from blockx_client.models import Cluster, Reservation, SubmitAnswer, Task
from blockx_client.transport import Transport
from blockx_core.coordinator import (
    PLACEMENT_METADATA_KEY,
    InvalidExplanation,
    PlacementExplanation,
    decode_explanation,
    every_worker_full,
)
from blockx_proto import bundlecoordinator_v1, coordinator_v1

_RESERVE: Final = "/coordinator.v1.CoordinatorService/ReserveWorkerSlot"
_BUNDLE_RESERVE: Final = "/bundlecoordinator.v1.BundleCoordinatorService/ReserveWorkerSlot"

Reply = TypeVar("Reply", bound=betterproto2.Message)


@dataclasses.dataclass(frozen=True, slots=True)
class SlotWait:
    """Placement backs off: what the last attempt met, and how long it waits now."""

    task_id: str
    attempt: int
    delay_s: float
    error: BlockxError

    @property
    def reason(self) -> str:
        """The per-worker reasons when the coordinator sent them, else the error."""
        if self.error.placement.workers or self.error.placement.omitted:
            return describe_workers(self.error.placement)
        return self.error.message


class PlacementListener(Protocol):
    """Told about every back-off of a placement, and when the placement ends."""

    def waiting(self, wait: SlotWait) -> None: ...
    def done(self) -> None: ...


_listener: contextvars.ContextVar[PlacementListener | None] = contextvars.ContextVar(
    "blockx_placement_listener", default=None
)


@contextlib.contextmanager
def listen_to_placement(listener: PlacementListener) -> Iterator[None]:
    """Report the back-offs of every placement started inside this block (and in the
    tasks it creates, which copy the context) to ``listener``."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def placement_of(metadata: Mapping[str, str | bytes] | None) -> PlacementExplanation | None:
    """The explanation in a refusal's trailing metadata; None if absent or malformed."""
    raw = None if metadata is None else metadata.get(PLACEMENT_METADATA_KEY)
    if not isinstance(raw, bytes):
        return None
    try:
        return decode_explanation(raw)
    except InvalidExplanation:
        return None


class Placement:
    def __init__(
        self,
        options: ClientOptions,
        transport: Transport,
        workers: WorkerRpc,
        rng: random.Random,
    ) -> None:
        self._options = options
        self._transport = transport
        self._workers = workers
        self._rng = rng

    async def reserve_worker_slot(
        self, task_id: str | None, cluster: Cluster, deadline_s: float | None
    ) -> Reservation:
        retry = self._options.retry
        task_id = task_id or str(uuid.uuid4())
        started = time.monotonic()
        deadline = None if deadline_s is None else started + deadline_s
        no_slot = unavailable = unreachable = 0
        last_no_slot: NoSlotError | None = None
        last_unreachable: ConnectError | None = None
        unreachable_since = 0.0
        listener = _listener.get()
        waited = False
        try:
            while True:
                try:
                    return await self._reserve_once(task_id, cluster, deadline)
                except NoSlotError as exc:
                    met: BlockxError = exc
                    last_no_slot = exc
                    no_slot += 1
                    unavailable = unreachable = 0
                    attempts = no_slot
                    delay = retry.no_slot.delay(no_slot, self._rng.random())
                    if deadline is not None and time.monotonic() + delay > deadline:
                        raise _gave_up(exc, task_id, deadline_s, no_slot) from None
                except UnavailableError as exc:
                    cut = deadline is not None and _cut_by(exc, deadline)
                    if cut and unreachable and last_unreachable is not None:
                        # The coordinator could not be reached; this attempt only ran
                        # out of the caller's time.
                        raise self._unreachable(
                            cluster,
                            time.monotonic() - unreachable_since,
                            unreachable,
                            last_unreachable,
                        ) from None
                    met = exc
                    refused, last_no_slot = last_no_slot, None
                    unavailable += 1
                    unreachable = 0
                    attempts = unavailable
                    if deadline is None and unavailable >= retry.unavailable_attempts:
                        raise
                    delay = retry.unavailable_delay(unavailable, self._rng.random())
                    if deadline is not None and time.monotonic() + delay > deadline:
                        if refused is not None and _cut_by(exc, deadline):
                            # The coordinator's last answer was "no slot"; this attempt
                            # only ran out of the caller's time.
                            raise _gave_up(refused, task_id, deadline_s, no_slot + 1) from None
                        raise UnavailableError(
                            f"{exc.message} (still so at the deadline of {deadline_s} s)",
                            exc.status,
                            placement=exc.placement,
                        ) from None
                except ConnectError as exc:
                    met = last_unreachable = exc
                    last_no_slot = None
                    now = time.monotonic()
                    if unreachable == 0:
                        unreachable_since = now
                    unreachable += 1
                    unavailable = 0
                    attempts = unreachable
                    delay = retry.unavailable_delay(unreachable, self._rng.random())
                    give_up_at = (
                        deadline
                        if deadline is not None
                        else unreachable_since + retry.unreachable_s
                    )
                    if now + delay > give_up_at:
                        raise self._unreachable(
                            cluster, now - unreachable_since, unreachable, exc
                        ) from None
                except SlotUncertainError as exc:
                    met = exc
                    last_no_slot = None
                    no_slot = unavailable = unreachable = 0
                    attempts = 1
                    delay = retry.slot_ttl_s
                    if deadline is not None and time.monotonic() + delay > deadline:
                        raise
                if listener is not None:
                    waited = True
                    listener.waiting(SlotWait(task_id, attempts, delay, met))
                await asyncio.sleep(delay)
        finally:
            if waited and listener is not None:
                listener.done()

    def _unreachable(
        self, cluster: Cluster, for_s: float, attempts: int, last: ConnectError
    ) -> CoordinatorUnreachableError:
        addr = self.coordinator_addr(cluster)
        where = self._transport.describe(addr)
        return CoordinatorUnreachableError(
            f"{cluster.value} coordinator unreachable at {where} for {for_s:.1f} s "
            f"({attempts} attempts; last: {last.message})",
            may_have_reached=False,
            setting=last.setting,
        )

    def coordinator_addr(self, cluster: Cluster) -> str:
        """The address of ``cluster``'s coordinator (InvalidRequestError: none set)."""
        if cluster is Cluster.BLOCK:
            return self._options.coordinator
        bundle_addr = self._options.bundle_coordinator
        if bundle_addr is None and not self._transport.proxied:
            raise InvalidRequestError(
                "this task belongs to the bundle cluster, but no bundle coordinator is "
                "configured: pass bundle_coordinator= (CLI: --bundle-coordinator) or set "
                "BLOCKX_BUNDLE_COORDINATOR"
            )
        return bundle_addr or ""

    async def _reserve_once(
        self, task_id: str, cluster: Cluster, deadline: float | None
    ) -> Reservation:
        timeout = self._timeout(deadline)
        addr = self.coordinator_addr(cluster)
        channel = self._transport.channel(addr)
        if cluster is Cluster.BUNDLE:
            bundle = await self._transport.unary(
                addr,
                _reserve_call(
                    channel,
                    _BUNDLE_RESERVE,
                    bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id=task_id),
                    bundlecoordinator_v1.ReserveWorkerSlotResponse,
                    timeout,
                ),
            )
            return Reservation(bundle.task_id, bundle.worker_addr, bundle.slot_id)
        block = await self._transport.unary(
            addr,
            _reserve_call(
                channel,
                _RESERVE,
                coordinator_v1.ReserveWorkerSlotRequest(task_id=task_id),
                coordinator_v1.ReserveWorkerSlotResponse,
                timeout,
            ),
        )
        return Reservation(block.task_id, block.worker_addr, block.slot_id)

    async def place(
        self,
        task: Task,
        cluster: Cluster,
        worker_addr: str | None,
        deadline: float | None,
        on_slot: Callable[[str], None] | None = None,
    ) -> SubmitAnswer:
        """Submit the task somewhere; the answer names the worker it runs on. With
        ``worker_addr`` the coordinator is skipped and the worker reserves inline.
        ``on_slot(worker_addr)`` is told of each reserved slot just before its
        SubmitTask goes out (so a Watch can open alongside)."""
        retry = self._options.retry
        for attempt in range(1, retry.resubmit_attempts + 1):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if worker_addr is not None:
                addr, slot_id = worker_addr, ""
            else:
                reservation = await self.reserve_worker_slot(task.task_id, cluster, remaining)
                addr, slot_id = reservation.worker_addr, reservation.slot_id
                if on_slot is not None:
                    on_slot(addr)
            try:
                return await self._workers.submit_task(task, worker_addr=addr, slot_id=slot_id)
            except (SlotInvalidError, UnavailableError, ConnectError) as exc:
                if _may_have_been_accepted(exc):
                    raise SubmitUncertainError(
                        f"SubmitTask to {addr} may have been accepted: {exc.message}", addr
                    ) from None
                # Nothing was accepted: reserve again (or retry the named worker).
                if attempt == retry.resubmit_attempts:
                    raise
                if worker_addr is not None or not isinstance(exc, SlotInvalidError):
                    await asyncio.sleep(retry.unavailable_delay(attempt, self._rng.random()))
            except NoSlotError:
                if worker_addr is None:
                    raise
                await asyncio.sleep(retry.no_slot.delay(attempt, self._rng.random()))
        raise AssertionError("unreachable")

    def _timeout(self, deadline: float | None) -> float:
        rpc_timeout_s = self._options.rpc_timeout_s
        if deadline is None:
            return rpc_timeout_s
        return max(0.001, min(rpc_timeout_s, deadline - time.monotonic()))


def _cut_by(exc: UnavailableError, deadline: float) -> bool:
    """Whether ``exc`` is an attempt that got no answer because the caller's deadline
    came, rather than a coordinator that stopped answering."""
    return exc.status is Status.DEADLINE_EXCEEDED and time.monotonic() >= deadline - 0.001


def _may_have_been_accepted(exc: BlockxError) -> bool:
    """Whether a failed SubmitTask can still have been accepted by the worker: a
    connection lost after the request went out, or no answer in time."""
    if isinstance(exc, ConnectError):
        return exc.may_have_reached
    return exc.status is Status.DEADLINE_EXCEEDED


async def _reserve_call(
    channel: Channel,
    route: str,
    request: betterproto2.Message,
    reply_type: type[Reply],
    timeout_s: float,
) -> Reply:
    """One ReserveWorkerSlot; a refusal becomes the client's error with the
    coordinator's placement explanation (the generated stub drops trailing metadata)."""
    async with channel.request(
        route, Cardinality.UNARY_UNARY, type(request), reply_type, timeout=timeout_s
    ) as stream:
        try:
            await stream.send_message(request, end=True)
            reply = await stream.recv_message()
        except GRPCError as exc:
            placement = placement_of(stream.trailing_metadata)
            raise error_for(exc.status, exc.message or "", placement) from None
    assert reply is not None  # a unary OK answer carries its message
    return reply


def _gave_up(
    last: NoSlotError, task_id: str, deadline_s: float | None, attempts: int
) -> NoSlotError:
    """The error that ends a wait for a slot at the caller's deadline: busy when
    every worker was full at the last attempt, timed out otherwise."""
    placement = last.placement
    reasons = describe_workers(placement) if placement.workers or placement.omitted else ""
    if every_worker_full(placement):
        return ClusterBusyError(
            f"busy: every worker is full ({reasons}); no slot for task {task_id} within "
            f"the deadline of {deadline_s} s ({attempts} attempts)",
            Status.RESOURCE_EXHAUSTED,
            placement=placement,
        )
    last_met = reasons or last.message
    return SlotWaitTimeoutError(
        f"timed out waiting for a slot for task {task_id}: none within the deadline of "
        f"{deadline_s} s ({attempts} attempts; last: {last_met})",
        Status.RESOURCE_EXHAUSTED,
        placement=placement,
    )
