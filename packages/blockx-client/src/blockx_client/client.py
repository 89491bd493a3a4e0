"""The async BlockX client.

    async with Client() as client:
        result = await client.run(Task.call_list("hello_world", [["ct2"], ["blockx"]]))
        print(result.state, result.outputs())

``run`` reserves a slot through the task's cluster Coordinator (backing off as the
seeds say), submits to the returned Worker and waits for the terminal state on a
Watch stream. ``run_many`` does that for many tasks with bounded concurrency and
one Watch stream per worker for many task_ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import msgspec
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from msgspec.structs import replace

from blockx_client.backoff import RetryPolicy
from blockx_client.errors import (
    BlockxError,
    ConnectError,
    FunctionError,
    InvalidRequestError,
    NoSlotError,
    SlotInvalidError,
    SlotUncertainError,
    TaskNotFoundError,
    UnavailableError,
    error_for,
)
from blockx_client.models import (
    Cluster,
    Durations,
    Invocation,
    IoTrace,
    Precheck,
    Reservation,
    Task,
    TaskResult,
    TaskState,
    TaskUpdate,
    result_from_pb,
    update_from_pb,
)
from blockx_client.routing import route
from blockx_client.transport import Transport
from blockx_proto import bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1

DEFAULT_COORDINATOR = "127.0.0.1:8080"
DEFAULT_SYNC_INVOKER = "127.0.0.1:9091"


class SubmitAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """SubmitTask's answer: RUNNING, or the terminal result of an earlier run of the
    same task_id (``result``; a worker never runs a task_id twice)."""

    task_id: str
    state: TaskState
    slot_id: str
    worker_addr: str
    result: TaskResult | None = None


class Client:
    """An async client of a BlockX deployment. Use as ``async with Client(...)``."""

    def __init__(
        self,
        *,
        coordinator: str | None = None,
        bundle_coordinator: str | None = None,
        sync_invoker: str | None = None,
        proxy_socket: str | None = None,
        retry: RetryPolicy | None = None,
        rpc_timeout_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        env = os.environ
        self.coordinator = coordinator or env.get("BLOCKX_COORDINATOR") or DEFAULT_COORDINATOR
        self.bundle_coordinator = bundle_coordinator or env.get("BLOCKX_BUNDLE_COORDINATOR")
        self.sync_invoker = sync_invoker or env.get("BLOCKX_SYNC_INVOKER") or DEFAULT_SYNC_INVOKER
        self.retry = retry or RetryPolicy()
        self.rpc_timeout_s = rpc_timeout_s
        self._rng = rng or random.Random()
        self._transport = Transport(proxy_socket or env.get("PROXY_SOCKET_PATH") or None)
        self._watchers: dict[str, _WatchBatcher] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for watcher in self._watchers.values():
            await watcher.close()
        self._watchers.clear()
        self._transport.close()

    @property
    def proxied(self) -> bool:
        return self._transport.proxied

    # ---- placement -------------------------------------------------------------------

    async def reserve_worker_slot(
        self,
        task_id: str | None = None,
        *,
        cluster: Cluster = Cluster.BLOCK,
        deadline_s: float | None = None,
    ) -> Reservation:
        """ReserveWorkerSlot with the seeds' back-off: RESOURCE_EXHAUSTED → jittered
        exponential back-off until the deadline; UNAVAILABLE → a few quick retries;
        ABORTED → wait one slot TTL, then the same task_id again."""
        task_id = task_id or str(uuid.uuid4())
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        no_slot = unavailable = 0
        while True:
            try:
                return await self._reserve_once(task_id, cluster, deadline)
            except NoSlotError:
                no_slot += 1
                delay = self.retry.no_slot.delay(no_slot, self._rng)
            except UnavailableError:
                unavailable += 1
                if unavailable >= self.retry.unavailable_attempts:
                    raise
                delay = self.retry.unavailable.delay(unavailable, self._rng)
            except SlotUncertainError:
                delay = self.retry.slot_ttl_s
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
            if self.bundle_coordinator is None and not self.proxied:
                raise InvalidRequestError(
                    "this task belongs to the bundle cluster, but no bundle coordinator is "
                    "configured (bundle_coordinator= or BLOCKX_BUNDLE_COORDINATOR)"
                )
            addr = self.bundle_coordinator or ""
            bundle = bundlecoordinator_v1.BundleCoordinatorServiceStub(
                self._transport.channel(addr)
            )
            reply = await self._call(
                addr,
                bundle.reserve_worker_slot(
                    bundlecoordinator_v1.ReserveWorkerSlotRequest(task_id=task_id),
                    timeout=timeout,
                ),
            )
            return Reservation(reply.task_id, reply.worker_addr, reply.slot_id)
        block = coordinator_v1.CoordinatorServiceStub(self._transport.channel(self.coordinator))
        reply2 = await self._call(
            self.coordinator,
            block.reserve_worker_slot(
                coordinator_v1.ReserveWorkerSlotRequest(task_id=task_id), timeout=timeout
            ),
        )
        return Reservation(reply2.task_id, reply2.worker_addr, reply2.slot_id)

    async def request_task_slot(
        self, worker_addr: str, task_id: str | None = None, *, ttl_ms: int = 5000
    ) -> Reservation:
        """RequestTaskSlot on a named worker (no coordinator, no back-off)."""
        task_id = task_id or str(uuid.uuid4())
        channel, metadata = self._transport.worker(worker_addr)
        reply = await self._call(
            worker_addr,
            worker_v1.WorkerServiceStub(channel).request_task_slot(
                worker_v1.RequestTaskSlotRequest(task_id=task_id, ttl_ms=ttl_ms),
                timeout=self.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return Reservation(reply.task_id, reply.worker_addr or worker_addr, reply.slot_id)

    # ---- worker.v1 --------------------------------------------------------------------

    async def submit_task(self, task: Task, *, worker_addr: str, slot_id: str = "") -> SubmitAnswer:
        """SubmitTask to a worker; without ``slot_id`` the worker reserves one inline."""
        task = task.with_id()
        channel, metadata = self._transport.worker(worker_addr)
        reply = await self._call(
            worker_addr,
            worker_v1.WorkerServiceStub(channel).submit_task(
                worker_v1.SubmitTaskRequest(task=task.to_pb(), slot_id=slot_id),
                timeout=self.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        result = result_from_pb(task.task_id, reply.state, reply.result, worker_addr)
        return SubmitAnswer(
            task_id=task.task_id,
            state=result.state,
            slot_id=reply.slot_id,
            worker_addr=worker_addr,
            result=result if result.state.is_terminal else None,
        )

    async def get_task_result(self, task_id: str, *, worker_addr: str) -> TaskResult:
        """The task's current state; TaskNotFoundError when unknown or expired."""
        channel, metadata = self._transport.worker(worker_addr)
        reply = await self._call(
            worker_addr,
            worker_v1.WorkerServiceStub(channel).get_task_result(
                worker_v1.GetTaskResultRequest(task_id=task_id),
                timeout=self.rpc_timeout_s,
                metadata=metadata,
            ),
        )
        return result_from_pb(task_id, reply.state, reply.result, worker_addr)

    async def watch_tasks(
        self, task_ids: Sequence[str], *, worker_addr: str
    ) -> AsyncIterator[TaskUpdate]:
        """One snapshot per task, then one terminal update per running task; ends when
        all are terminal. Closing the iterator closes the stream."""
        channel, metadata = self._transport.worker(worker_addr)
        stub = worker_v1.WorkerServiceStub(channel)
        try:
            async for update in stub.watch_tasks(
                worker_v1.WatchTasksRequest(task_ids=list(task_ids)), metadata=metadata
            ):
                yield update_from_pb(update)
        except GRPCError as exc:
            raise error_for(exc.status, exc.message or "") from None
        except (OSError, StreamTerminatedError) as exc:
            raise ConnectError(f"lost the Watch stream to {worker_addr}: {exc}") from None

    # ---- run -------------------------------------------------------------------------

    async def run(
        self,
        task: Task,
        *,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
    ) -> TaskResult:
        """Reserve (with back-off), submit, and wait for the terminal state.

        The task_id (generated if empty) is kept across every placement retry: it is
        the idempotency key. With ``worker_addr`` the coordinator is skipped and the
        worker reserves a slot inline.
        """
        task = task.with_id()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        placed = await self._place(task, cluster or route(task), worker_addr, deadline)
        if placed.result is not None:
            return placed.result  # an earlier run of this task_id, retained
        return await self._watcher(placed.worker_addr).wait(task.task_id)

    submit_and_wait = run

    async def place(
        self,
        task: Task,
        *,
        cluster: Cluster | None = None,
        worker_addr: str | None = None,
        deadline_s: float | None = None,
    ) -> SubmitAnswer:
        """Reserve (with back-off) and submit, without waiting for the end."""
        task = task.with_id()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        return await self._place(task, cluster or route(task), worker_addr, deadline)

    async def _place(
        self,
        task: Task,
        cluster: Cluster,
        worker_addr: str | None,
        deadline: float | None,
    ) -> SubmitAnswer:
        """Submit the task somewhere; the answer names the worker it runs on."""
        for attempt in range(1, self.retry.resubmit_attempts + 1):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if worker_addr is not None:
                addr, slot_id = worker_addr, ""
            else:
                reservation = await self.reserve_worker_slot(
                    task.task_id, cluster=cluster, deadline_s=remaining
                )
                addr, slot_id = reservation.worker_addr, reservation.slot_id
            try:
                return await self.submit_task(task, worker_addr=addr, slot_id=slot_id)
            except SlotInvalidError:
                # The slot expired or the worker restarted: reserve again, same task_id.
                if attempt == self.retry.resubmit_attempts:
                    raise
            except NoSlotError:
                if worker_addr is None:
                    raise
                await asyncio.sleep(self.retry.no_slot.delay(attempt, self._rng))
        raise AssertionError("unreachable")

    async def run_many(
        self,
        tasks: Iterable[Task],
        *,
        concurrency: int = 32,
        cluster: Cluster | None = None,
        deadline_s: float | None = None,
    ) -> AsyncIterator[TaskResult]:
        """Run many tasks: at most ``concurrency`` placed and unfinished at a time,
        results yielded as tasks finish (not in input order)."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        gate = asyncio.Semaphore(concurrency)
        results: asyncio.Queue[TaskResult | BaseException] = asyncio.Queue()

        async def one(task: Task) -> None:
            try:
                results.put_nowait(await self.run(task, cluster=cluster, deadline_s=deadline_s))
            except Exception as exc:
                results.put_nowait(exc)
            finally:
                gate.release()

        async def feed() -> int:
            count = 0
            for task in tasks:
                await gate.acquire()
                running.add(asyncio.create_task(one(task)))
                count += 1
            return count

        running: set[asyncio.Task[None]] = set()
        feeder = asyncio.create_task(feed())
        received = 0
        try:
            while not feeder.done() or received < feeder.result():
                getter = asyncio.ensure_future(results.get())
                done, _ = await asyncio.wait({getter, feeder}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    continue
                item = getter.result()
                received += 1
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            feeder.cancel()
            for task in running:
                task.cancel()

    async def run_with_retries(
        self, task: Task, *, max_attempts: int = 3, **kwargs: Any
    ) -> list[TaskResult]:
        """Run, and re-run retryable failures under a NEW task_id each time (a worker
        answers a resubmitted task_id with its retained result, never a new run).
        Returns every attempt, the last one last; each records its lineage."""
        task = task.with_id()
        original = task.task_id
        attempts: list[TaskResult] = []
        for n in range(1, max_attempts + 1):
            this = task if n == 1 else replace(task, task_id=f"{original}.retry-{n}")
            result = await self.run(this, **kwargs)
            result = replace(result, attempt=n, original_task_id=original)
            attempts.append(result)
            if result.ok or not result.retryable:
                break
        return attempts

    def _watcher(self, worker_addr: str) -> _WatchBatcher:
        watcher = self._watchers.get(worker_addr)
        if watcher is None:
            watcher = self._watchers[worker_addr] = _WatchBatcher(self, worker_addr)
        return watcher

    # ---- the Sync Invoker ---------------------------------------------------------------

    def function(self, name: str) -> FunctionHandle:
        """A handle to call one function through the Sync Invoker (outside executors)."""
        return FunctionHandle(self, name)

    # ---- internals -------------------------------------------------------------------

    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.rpc_timeout_s
        return max(0.001, min(self.rpc_timeout_s, deadline - time.monotonic()))

    async def _call(self, addr: str, call: Any) -> Any:
        """Await a unary call; gRPC statuses become BlockxErrors, transport failures
        ConnectError (a refused connection means nothing reached the server)."""
        try:
            return await call
        except GRPCError as exc:
            raise error_for(exc.status, exc.message or "") from None
        except TimeoutError:
            raise UnavailableError(
                f"{addr} did not answer in time", Status.DEADLINE_EXCEEDED
            ) from None
        except (OSError, StreamTerminatedError) as exc:
            where = self._transport_name(addr)
            raise ConnectError(f"cannot reach {where}: {exc}") from None

    def _transport_name(self, addr: str) -> str:
        return f"the proxy for {addr}" if self.proxied else addr


class _WatchBatcher:
    """Waits for many tasks on one worker with few Watch streams: the task_ids that
    arrive within a short linger share one stream; a broken stream is reopened for
    the tasks still pending, and a task the worker no longer knows is looked up."""

    LINGER_S = 0.01

    def __init__(self, client: Client, worker_addr: str) -> None:
        self._client = client
        self._addr = worker_addr
        self._pending: dict[str, asyncio.Future[TaskResult]] = {}
        self._batch: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._streams: set[asyncio.Task[None]] = set()

    async def wait(self, task_id: str) -> TaskResult:
        future = self._pending.get(task_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[task_id] = future
            self._batch.add(task_id)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        await asyncio.sleep(self.LINGER_S)
        batch, self._batch = self._batch, set()
        stream = asyncio.create_task(self._watch(sorted(batch)))
        self._streams.add(stream)
        stream.add_done_callback(self._streams.discard)

    async def _watch(self, task_ids: list[str]) -> None:
        waiting = set(task_ids)
        failures = 0
        while waiting:
            try:
                async for update in self._client.watch_tasks(
                    sorted(waiting), worker_addr=self._addr
                ):
                    if update.is_terminal and update.task_id in waiting:
                        waiting.discard(update.task_id)
                        assert update.result is not None
                        self._resolve(update.task_id, update.result)
                if waiting:
                    # The stream ended early (the worker drained?): ask directly.
                    await self._lookup(waiting)
            except (ConnectError, BlockxError) as exc:
                failures += 1
                if failures > 5:
                    for task_id in list(waiting):
                        self._fail(task_id, exc)
                    return
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))

    async def _lookup(self, waiting: set[str]) -> None:
        for task_id in list(waiting):
            try:
                result = await self._client.get_task_result(task_id, worker_addr=self._addr)
            except TaskNotFoundError as exc:
                waiting.discard(task_id)
                self._fail(task_id, exc)
                continue
            if result.state.is_terminal:
                waiting.discard(task_id)
                self._resolve(task_id, result)

    def _resolve(self, task_id: str, result: TaskResult) -> None:
        future = self._pending.pop(task_id, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _fail(self, task_id: str, exc: BaseException) -> None:
        future = self._pending.pop(task_id, None)
        if future is not None and not future.done():
            future.set_exception(exc)

    async def close(self) -> None:
        tasks = [*self._streams, *([self._flusher] if self._flusher else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


class FunctionHandle:
    """``client.function("name")``: call one function synchronously via the Sync Invoker.

    (Inside an executor, ``blockx_executor.call`` is the way: a sub-call of the task.)
    """

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def _stub(self) -> syncinvoker_v1.SyncInvokerServiceStub:
        return syncinvoker_v1.SyncInvokerServiceStub(
            self._client._transport.channel(self._client.sync_invoker)
        )

    async def invoke(self, *args: Any, timeout_ms: int = 0, call_id: str = "") -> Invocation:
        """Run once; the Invocation says how it went (a failure is not an exception)."""
        reply = await self._client._call(
            self._client.sync_invoker,
            self._stub().invoke(
                syncinvoker_v1.InvokeRequest(
                    function=self.name,
                    args=json.dumps(list(args)),
                    timeout_ms=timeout_ms,
                    call_id=call_id,
                ),
                timeout=self._client.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        return _invocation(reply)

    async def call(self, *args: Any, timeout_ms: int = 0) -> Any:
        """Run once and return the function's value; FunctionError when it fails."""
        result = await self.invoke(*args, timeout_ms=timeout_ms)
        if not result.success:
            raise FunctionError(
                result.failure_code,
                result.failure_message,
                retryable=result.retryable,
                call_id=result.call_id,
            )
        return result.value

    async def debug(self, *args: Any, timeout_ms: int = 0) -> Invocation:
        """Invoke, plus what the function printed/logged and a trace of its IO."""
        reply = await self._client._call(
            self._client.sync_invoker,
            self._stub().debug_invoke(
                syncinvoker_v1.DebugInvokeRequest(
                    function=self.name, args=json.dumps(list(args)), timeout_ms=timeout_ms
                ),
                timeout=self._client.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        base = _invocation(reply.response or syncinvoker_v1.InvokeResponse())
        return replace(
            base,
            output=reply.output,
            io_trace=tuple(
                IoTrace(
                    backend=t.backend,
                    op=t.op,
                    request=t.request,
                    duration_us=t.duration_us,
                    success=t.success,
                    error=t.error,
                )
                for t in reply.io_trace
            ),
        )

    async def precheck(self, *args: Any, check_args: bool = True) -> Precheck:
        """Compile and check the signature against ``args``, without running it."""
        reply = await self._client._call(
            self._client.sync_invoker,
            self._stub().precheck(
                syncinvoker_v1.PrecheckRequest(
                    function=self.name, args=json.dumps(list(args)) if check_args else ""
                ),
                timeout=self._client.rpc_timeout_s,
            ),
        )
        return Precheck(
            ok=reply.ok,
            failure_code=reply.failure_code,
            message=reply.message,
            signature=reply.signature,
            is_async=reply.is_async,
            code_epoch=reply.code_epoch,
        )


def _invocation(reply: syncinvoker_v1.InvokeResponse) -> Invocation:
    durations = reply.durations or syncinvoker_v1.CallDurations()
    return Invocation(
        call_id=reply.call_id,
        success=reply.success,
        value=json.loads(reply.result) if reply.success and reply.result else None,
        failure_code=reply.failure_code,
        failure_message=reply.failure_message,
        retryable=reply.retryable,
        durations=Durations(
            queue_us=durations.queue_us, cpu_us=durations.cpu_us, io_us=durations.io_us
        ),
        code_epoch=reply.code_epoch,
    )
