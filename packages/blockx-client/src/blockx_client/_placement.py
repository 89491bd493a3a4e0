"""Placement: ReserveWorkerSlot with back-off, then SubmitTask to the slot's worker.

The back-off follows the status of each answer: RESOURCE_EXHAUSTED (no slot) is
retried with jittered exponential back-off until the deadline; UNAVAILABLE gets a
few quick retries; ABORTED (a worker may hold a slot for this task_id) waits one
slot TTL and asks again with the same task_id. A FAILED_PRECONDITION on SubmitTask
(the slot expired, or the worker restarted) reserves again, same task_id: the
task_id is the idempotency key throughout.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from grpclib.const import Status

from blockx_client._options import ClientOptions
from blockx_client._worker_rpc import WorkerRpc
from blockx_client.errors import (
    InvalidRequestError,
    NoSlotError,
    SlotInvalidError,
    SlotUncertainError,
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
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        no_slot = unavailable = 0
        while True:
            try:
                return await self._reserve_once(task_id, cluster, deadline)
            except NoSlotError:
                no_slot += 1
                delay = retry.no_slot.delay(no_slot, self._rng)
            except UnavailableError:
                unavailable += 1
                if unavailable >= retry.unavailable_attempts:
                    raise
                delay = retry.unavailable.delay(unavailable, self._rng)
            except SlotUncertainError:
                delay = retry.slot_ttl_s
            if deadline is not None and time.monotonic() + delay > deadline:
                raise NoSlotError(
                    f"no slot for task {task_id} within the deadline of {deadline_s} s",
                    Status.RESOURCE_EXHAUSTED,
                )
            await asyncio.sleep(delay)

    async def _reserve_once(
        self, task_id: str, cluster: Cluster, deadline: float | None
    ) -> Reservation:
        timeout = self._timeout(deadline)
        if cluster is Cluster.BUNDLE:
            bundle_addr = self._options.bundle_coordinator
            if bundle_addr is None and not self._transport.proxied:
                raise InvalidRequestError(
                    "this task belongs to the bundle cluster, but no bundle coordinator is "
                    "configured (bundle_coordinator= or BLOCKX_BUNDLE_COORDINATOR)"
                )
            addr = bundle_addr or ""
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
        addr = self._options.coordinator
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
    ) -> SubmitAnswer:
        """Submit the task somewhere; the answer names the worker it runs on. With
        ``worker_addr`` the coordinator is skipped and the worker reserves inline."""
        retry = self._options.retry
        for attempt in range(1, retry.resubmit_attempts + 1):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if worker_addr is not None:
                addr, slot_id = worker_addr, ""
            else:
                reservation = await self.reserve_worker_slot(task.task_id, cluster, remaining)
                addr, slot_id = reservation.worker_addr, reservation.slot_id
            try:
                return await self._workers.submit_task(task, worker_addr=addr, slot_id=slot_id)
            except SlotInvalidError:
                # The slot expired or the worker restarted: reserve again, same task_id.
                if attempt == retry.resubmit_attempts:
                    raise
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
