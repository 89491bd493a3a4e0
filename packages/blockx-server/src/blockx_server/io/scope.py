"""TaskIoScope: a task's one door to IO, opened at activation, closed at convergence.

Every read of a Builder, every read of a function (an executor's IO request) and
every write of a Writer Plugin goes through the scope of its task. A scope opened
for functions and Builders is read-only (a write fails WRITE_FORBIDDEN); the
Writer Plugin's scope may write. The scope counts the task's requests, backend
time and bytes.

What a request goes through, in order: the process's read cache (an immutable
read answered there costs no backend time); the task's singleflight (an identical
read already in flight is waited for, not sent again); the task's IO window (at
most IO_TASK_MAX_INFLIGHT backend requests of the task in flight, the rest wait
FIFO); the backend's admission (``IoRouter.serve``). Only the backend's time is
``io_us``, charged to a call; every wait is ``queue_us``.

A scope reads one chain (the task's: ``chain``): its ``io.blockdb``, ``io.rpc`` and
``io.meta`` are that chain's; ``io.router.chain(name)`` reaches another. It also
knows the Function Code View epoch the task pinned, which ``io.meta.code_epoch()``
answers, and the Iceberg snapshot of each table the task read first, which its
later ``io.iceberg.scan`` of that table read (``SnapshotPins``).

Functions' requests are answered as they come: a failure reaches the function as
``IoError``. Builders and Writers ask with ``retry=True`` (or through
``retrying()``): a retryable failure is tried again up to IO_RETRY_MAX_ATTEMPTS
attempts with jittered exponential back-off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import random
import time
from typing import Any, assert_never

import msgspec

from blockx_core.failures import IoErrorKind
from blockx_core.io import CacheKey, GiveUp, IoWindow, RetryAfter, Singleflight
from blockx_server.io.backends.iceberg import SnapshotPins
from blockx_server.io.backends.meta import CODE_EPOCH_OP, META
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome, failure
from blockx_server.io.router import IoRouter, Prepared


class IoStats(msgspec.Struct, kw_only=True):
    """What one task's IO cost: requests, failed requests, backend time, answer bytes
    (of the answers encoded as JSON), and how many requests the cache or a shared
    request answered."""

    requests: int = 0
    failures: int = 0
    backend_us: int = 0
    queue_us: int = 0
    bytes: int = 0
    cache_hits: int = 0
    shared: int = 0
    retries: int = 0


class _Use(enum.Enum):
    """How a read may be answered: from the read cache or a request in flight
    (SHARED); fresh from the backend, still sharing a request in flight (FRESH);
    fresh, alone, as the backend's value without its JSON (VALUE)."""

    SHARED = "shared"
    FRESH = "fresh"
    VALUE = "value"


class _TaskIo:
    """What a task's scopes share: the singleflight table and the IO window."""

    def __init__(self, max_inflight: int) -> None:
        self.flights: Singleflight[CacheKey, asyncio.Future[IoOutcome]] = Singleflight()
        self.window: IoWindow[int] = IoWindow(max_inflight)
        self.window_waiters: dict[int, asyncio.Future[None]] = {}
        self.tickets = itertools.count()
        # The Iceberg snapshot each table was first read at: one per task.
        self.pins = SnapshotPins()

    async def enter_window(self) -> None:
        ticket = next(self.tickets)
        if self.window.request(ticket):
            return
        waiter = asyncio.get_running_loop().create_future()
        self.window_waiters[ticket] = waiter
        try:
            await waiter
        except asyncio.CancelledError:
            self.window_waiters.pop(ticket, None)
            admitted = waiter.done() and not waiter.cancelled()
            if not self.window.cancel(ticket) and admitted:
                self.leave_window()
            raise

    def leave_window(self) -> None:
        while (ticket := self.window.release()) is not None:
            waiter = self.window_waiters.pop(ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
                return
            # That waiter was cancelled before it started: pass its turn on.


class TaskIoScope:
    def __init__(
        self,
        router: IoRouter,
        task_id: str,
        *,
        writes: bool = False,
        chain: str | None = None,
        code_epoch: int | None = None,
    ) -> None:
        self._router = router
        self.task_id = task_id
        self.writes = writes
        self.chain = chain
        self.code_epoch = code_epoch
        self.stats = IoStats()
        self._closed = False
        self._task_io = _TaskIo(router.settings.task_max_inflight)
        # A writer scope lives and dies with the task's scope it was opened from.
        self._parent: TaskIoScope | None = None

    @property
    def closed(self) -> bool:
        return self._closed or (self._parent is not None and self._parent.closed)

    def writer(self) -> TaskIoScope:
        """The same task's scope for its Writer Plugin: it may write, it counts into
        the same statistics and the same IO window, and it closes when this scope
        closes."""
        scope = TaskIoScope(
            self._router, self.task_id, writes=True, chain=self.chain, code_epoch=self.code_epoch
        )
        scope.stats = self.stats
        scope._task_io = self._task_io
        scope._parent = self
        return scope

    def retrying(self) -> RetryingIo:
        """This scope, for a Builder or a Writer: every request retries."""
        return RetryingIo(self)

    async def request(
        self,
        backend: str,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any] | None = None,
        *,
        retry: bool = False,
        cache: bool = True,
        as_json: bool = True,
    ) -> IoOutcome:
        """One request; with ``retry`` a retryable failure is tried again
        (IO_RETRY_MAX_ATTEMPTS attempts, jittered back-off). The answer's ``io_us``
        and ``queue_us`` cover every attempt. ``cache=False``: the read neither uses
        nor fills the read cache (a Builder's scan reads each range once).
        ``as_json=False`` (an in-process reader of ``IoOk.value`` alone, a Builder or
        a Writer): the answer is not encoded as JSON (``value_json`` is empty), and
        the read neither uses the cache nor shares another request in flight, whose
        reader may need the JSON."""
        use = (_Use.SHARED if cache else _Use.FRESH) if as_json else _Use.VALUE
        outcome = await self._attempt(backend, op, args, kwargs or {}, use)
        if not retry:
            return outcome
        attempts, io_us, queue_us = 1, outcome.io_us, outcome.queue_us
        while isinstance(outcome, IoFailed):
            decision = self._router.retry_policy.decide(
                attempts=attempts, retryable=outcome.retryable, jitter=random.random()
            )
            match decision:
                case GiveUp():
                    break
                case RetryAfter():
                    await asyncio.sleep(decision.delay_ms / 1000)
                case _:
                    assert_never(decision)
            attempts += 1
            self.stats.retries += 1
            outcome = await self._attempt(backend, op, args, kwargs or {}, use)
            io_us += outcome.io_us
            queue_us += outcome.queue_us
        return msgspec.structs.replace(outcome, io_us=io_us, queue_us=queue_us)

    def close(self) -> None:
        self._closed = True

    async def _attempt(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any], use: _Use
    ) -> IoOutcome:
        pin = await self._task_io.pins.pin(backend, op, args, kwargs)
        outcome: IoOutcome | None = None
        try:
            outcome = await self._pinned_attempt(backend, op, pin.args, pin.kwargs, use)
            return outcome
        finally:
            pin.learn(outcome)

    async def _pinned_attempt(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any], use: _Use
    ) -> IoOutcome:
        outcome: IoOutcome
        if self.closed:
            outcome = failure(IoErrorKind.UNAVAILABLE, "the task's IO scope is closed")
        else:
            if (backend, op) == (META, CODE_EPOCH_OP):
                # What the task pinned, which only its scope knows.
                args, kwargs = [self.code_epoch], {}
            prepared = self._router.prepare(
                backend, op, args, kwargs, writes=self.writes, chain=self.chain
            )
            if isinstance(prepared, IoFailed):
                outcome = prepared
            else:
                if use is not _Use.SHARED and prepared.cacheable:
                    prepared = dataclasses.replace(prepared, cacheable=False)
                if use is _Use.VALUE and not prepared.write:
                    prepared = dataclasses.replace(prepared, as_json=False)
                    outcome = await self._send(prepared)
                else:
                    outcome = self._router.cached(prepared) or await self._fetch(prepared)
        self._count(outcome)
        self._router.record(backend, op, outcome)
        return outcome

    async def _fetch(self, prepared: Prepared) -> IoOutcome:
        if prepared.write:
            return await self._send(prepared)
        flights = self._task_io.flights
        waiter: asyncio.Future[IoOutcome] = asyncio.get_running_loop().create_future()
        if not flights.arrive(prepared.key, waiter):
            started = time.perf_counter_ns()
            shared = await waiter
            waited = (time.perf_counter_ns() - started) // 1000
            return msgspec.structs.replace(shared, io_us=0, queue_us=waited, shared=True)
        outcome: IoOutcome | None = None
        try:
            outcome = await self._send(prepared)
            return outcome
        finally:
            answer = outcome or failure(
                IoErrorKind.UNAVAILABLE, "the shared request was cancelled before it answered"
            )
            for follower in flights.complete(prepared.key):
                if not follower.done():
                    follower.set_result(answer)

    async def _send(self, prepared: Prepared) -> IoOutcome:
        started = time.perf_counter_ns()
        await self._task_io.enter_window()
        window_us = (time.perf_counter_ns() - started) // 1000
        try:
            outcome = await self._router.serve(prepared)
        finally:
            self._task_io.leave_window()
        return msgspec.structs.replace(outcome, queue_us=outcome.queue_us + window_us)

    def _count(self, outcome: IoOutcome) -> None:
        stats = self.stats
        stats.requests += 1
        stats.backend_us += outcome.io_us
        stats.queue_us += outcome.queue_us
        stats.shared += outcome.shared
        match outcome:
            case IoOk():
                stats.cache_hits += outcome.cached
                stats.bytes += len(outcome.value_json)
            case IoFailed():
                stats.failures += 1
            case _:
                assert_never(outcome)


class RetryingIo:
    """A scope whose requests retry (what Builders and Writers read and write with)."""

    def __init__(self, scope: TaskIoScope) -> None:
        self.scope = scope

    async def request(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any] | None = None
    ) -> IoOutcome:
        return await self.scope.request(backend, op, args, kwargs, retry=True)
