"""BackendGate: a backend's adaptive admission (``blockx_core.io.BackendAdmission``)
on the event loop.

``acquire`` admits a request or parks it on a future until the core admits it or
times it out; ``release`` reports the backend's latency and outcome, which moves the
limit and wakes the queue. One timer, armed from the core's next deadline, times
out requests queued longer than IO_QUEUE_TIMEOUT_MS.
"""

from __future__ import annotations

import asyncio
import itertools

from blockx_core.io import Admit, BackendAdmission, ConcurrencyLimit
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.timer import DeadlineTimer


class BackendGate:
    def __init__(
        self,
        backend: str,
        limiter: ConcurrencyLimit,
        queue_timeout_ms: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.backend = backend
        self.core = BackendAdmission(limiter, queue_timeout_ms)
        self._clock = clock
        self._tickets = itertools.count()
        self._waiters: dict[int, asyncio.Future[bool]] = {}
        self._timer = DeadlineTimer(clock, self._on_timer)

    @property
    def limit(self) -> int:
        return self.core.limit

    @property
    def in_flight(self) -> int:
        return self.core.in_flight

    @property
    def queued(self) -> int:
        return self.core.queued

    async def acquire(self) -> bool:
        """True once admitted (call ``release`` or ``abandon`` after); False when the
        request waited IO_QUEUE_TIMEOUT_MS and was given up."""
        ticket = next(self._tickets)
        if self.core.submit(ticket, self._clock.now_ms()):
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter
        self._arm_timer()
        try:
            return await waiter
        except asyncio.CancelledError:
            self._waiters.pop(ticket, None)
            # Still queued: leave the queue. Admitted just before the cancellation:
            # hand the room on. (A waiter cancelled before its admission is handed
            # on by ``_wake`` itself.)
            admitted = waiter.done() and not waiter.cancelled() and waiter.result()
            if not self.core.cancel(ticket) and admitted:
                self._wake(self.core.abandon())
            raise

    def release(self, *, latency_us: int, ok: bool) -> None:
        self._wake(self.core.complete(latency_us=latency_us, ok=ok, now_ms=self._clock.now_ms()))

    def abandon(self) -> None:
        self._wake(self.core.abandon())

    def _wake(self, admitted: list[Admit]) -> None:
        for admit in admitted:
            waiter = self._waiters.pop(admit.ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(True)
            else:
                # Its caller is gone (cancelled between the admission and now).
                self._wake(self.core.abandon())

    def _arm_timer(self) -> None:
        self._timer.arm(self.core.next_deadline_ms())

    def _on_timer(self) -> None:
        for timed_out in self.core.tick(self._clock.now_ms()):
            waiter = self._waiters.pop(timed_out.ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(False)
        self._arm_timer()
