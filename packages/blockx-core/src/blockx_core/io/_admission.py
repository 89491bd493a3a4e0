"""BackendAdmission: one backend's requests in flight, held to its adaptive limit.

A request is admitted at once while fewer than ``limit`` are in flight; otherwise
it queues, FIFO. A finished request reports its latency and outcome (which moves
the limit) and frees room for the queue. A request queued for
``queue_timeout_ms`` or longer is timed out: ``tick(now_ms)`` reports it, and
``next_deadline_ms()`` says when the next one would be, so the adapter arms one
timer (the aioquic way). Time is only ever an argument.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from blockx_core.io._limits import ConcurrencyLimit


class Admit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A queued request may start now."""

    ticket: int
    waited_ms: int


class QueueTimedOut(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A queued request waited too long: it fails (retryable UNAVAILABLE)."""

    ticket: int
    waited_ms: int


AdmissionCommand = Admit | QueueTimedOut


class BackendAdmission:
    def __init__(self, limiter: ConcurrencyLimit, queue_timeout_ms: int) -> None:
        if queue_timeout_ms < 0:
            raise ValueError("queue_timeout_ms must be >= 0")
        self.limiter = limiter
        self.queue_timeout_ms = queue_timeout_ms
        self.in_flight = 0
        self.timed_out = 0
        # ticket -> the time it queued; insertion order is arrival order.
        self._queue: OrderedDict[int, int] = OrderedDict()

    @property
    def limit(self) -> int:
        return self.limiter.limit

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, ticket: int, now_ms: int) -> bool:
        """True: start now. False: queued until an Admit or QueueTimedOut names it."""
        if not self._queue and self.in_flight < self.limiter.limit:
            self.in_flight += 1
            return True
        if ticket in self._queue:
            raise ValueError(f"ticket {ticket} is already queued")
        self._queue[ticket] = now_ms
        return False

    def complete(self, *, latency_us: int, ok: bool, now_ms: int) -> list[Admit]:
        """An admitted request finished; the queued requests that start now."""
        if self.in_flight <= 0:
            raise ValueError("complete() without a request in flight")
        self.limiter.on_sample(
            latency_us=latency_us, ok=ok, in_flight=self.in_flight, now_ms=now_ms
        )
        self.in_flight -= 1
        return self._admit(now_ms)

    def abandon(self) -> list[Admit]:
        """An admitted request ended without an answer to learn from (cancelled)."""
        if self.in_flight <= 0:
            raise ValueError("abandon() without a request in flight")
        self.in_flight -= 1
        return self._admit(None)

    def cancel(self, ticket: int) -> bool:
        """A queued request's caller gave up; False when it was not queued."""
        return self._queue.pop(ticket, None) is not None

    def tick(self, now_ms: int) -> list[QueueTimedOut]:
        timed_out: list[QueueTimedOut] = []
        while self._queue:
            ticket, queued_ms = next(iter(self._queue.items()))
            if now_ms - queued_ms < self.queue_timeout_ms:
                break
            del self._queue[ticket]
            timed_out.append(QueueTimedOut(ticket=ticket, waited_ms=now_ms - queued_ms))
        self.timed_out += len(timed_out)
        return timed_out

    def next_deadline_ms(self) -> int | None:
        if not self._queue:
            return None
        return next(iter(self._queue.values())) + self.queue_timeout_ms

    def _admit(self, now_ms: int | None) -> list[Admit]:
        admitted: list[Admit] = []
        while self._queue and self.in_flight < self.limiter.limit:
            ticket, queued_ms = self._queue.popitem(last=False)
            self.in_flight += 1
            waited = 0 if now_ms is None else max(0, now_ms - queued_ms)
            admitted.append(Admit(ticket=ticket, waited_ms=waited))
        return admitted
