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
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable

from grpclib.const import Status

from blockx_client._options import ClientOptions
from blockx_client._worker_rpc import WorkerRpc
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
from blockx_client.models import Cluster, Reservation, SubmitAnswer, Task
from blockx_client.transport import Transport
from blockx_proto import bundlecoordinator_v1, coordinator_v1


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
        unreachable_since = 0.0
        while True:
            try:
                return await self._reserve_once(task_id, cluster, deadline)
            except NoSlotError:
                no_slot += 1
                unavailable = unreachable = 0
                delay = retry.no_slot.delay(no_slot, self._rng)
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise NoSlotError(
                        f"no slot for task {task_id} within the deadline of {deadline_s} s "
                        "(RESOURCE_EXHAUSTED)",
                        Status.RESOURCE_EXHAUSTED,
                    ) from None
            except UnavailableError as exc:
                unavailable += 1
                unreachable = 0
                if deadline is None and unavailable >= retry.unavailable_attempts:
                    raise
                delay = retry.unavailable_delay(unavailable, self._rng)
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise UnavailableError(
                        f"{exc.message} (still so at the deadline of {deadline_s} s)", exc.status
                    ) from None
            except ConnectError as exc:
                now = time.monotonic()
                if unreachable == 0:
                    unreachable_since = now
                unreachable += 1
                unavailable = 0
                delay = retry.unavailable_delay(unreachable, self._rng)
                give_up_at = (
                    deadline if deadline is not None else unreachable_since + retry.unreachable_s
                )
                if now + delay > give_up_at:
                    raise self._unreachable(
                        cluster, now - unreachable_since, unreachable, exc
                    ) from None
            except SlotUncertainError:
                no_slot = unavailable = unreachable = 0
                delay = retry.slot_ttl_s
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
            await asyncio.sleep(delay)

    def _unreachable(
        self, cluster: Cluster, for_s: float, attempts: int, last: ConnectError
    ) -> CoordinatorUnreachableError:
        addr = self._coordinator_addr(cluster)
        where = self._transport.describe(addr)
        return CoordinatorUnreachableError(
            f"{cluster.value} coordinator unreachable at {where} for {for_s:.1f} s "
            f"({attempts} attempts; last: {last.message})",
            may_have_reached=False,
        )

    def _coordinator_addr(self, cluster: Cluster) -> str:
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
        addr = self._coordinator_addr(cluster)
        if cluster is Cluster.BUNDLE:
            bundle = bundlecoordinator_v1.BundleCoordinatorServiceStub(
                self._transport.channel(addr)
            )
            reply = await self._transport.unary(
                addr,
                bundle.reserve_worker_slot(
                    bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id=task_id),
                    timeout=timeout,
                ),
            )
            return Reservation(reply.task_id, reply.worker_addr, reply.slot_id)
        block = coordinator_v1.CoordinatorServiceStub(self._transport.channel(addr))
        reply2 = await self._transport.unary(
            addr,
            block.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id=task_id), timeout=timeout
            ),
        )
        return Reservation(reply2.task_id, reply2.worker_addr, reply2.slot_id)

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
                    await asyncio.sleep(retry.unavailable_delay(attempt, self._rng))
            except NoSlotError:
                if worker_addr is None:
                    raise
                await asyncio.sleep(retry.no_slot.delay(attempt, self._rng))
        raise AssertionError("unreachable")

    def _timeout(self, deadline: float | None) -> float:
        rpc_timeout_s = self._options.rpc_timeout_s
        if deadline is None:
            return rpc_timeout_s
        return max(0.001, min(rpc_timeout_s, deadline - time.monotonic()))


def _may_have_been_accepted(exc: BlockxError) -> bool:
    """Whether a failed SubmitTask can still have been accepted by the worker: a
    connection lost after the request went out, or no answer in time."""
    if isinstance(exc, ConnectError):
        return exc.may_have_reached
    return exc.status is Status.DEADLINE_EXCEEDED
