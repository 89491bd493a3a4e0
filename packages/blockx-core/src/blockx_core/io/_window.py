"""IoWindow: a cap on one task's backend requests in flight; the excess waits FIFO.

Invariant: ``in_flight <= cap``. A slot freed by ``release`` goes to the oldest
waiter at once (it is returned), so a later arrival cannot overtake it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class IoWindow(Generic[T]):
    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.cap = cap
        self.in_flight = 0
        self._waiting: OrderedDict[T, None] = OrderedDict()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def request(self, ticket: T) -> bool:
        """True: ``ticket`` may start now. False: it waits until ``release`` returns it."""
        if self.in_flight < self.cap and not self._waiting:
            self.in_flight += 1
            return True
        self._waiting[ticket] = None
        return False

    def release(self) -> T | None:
        """A request finished: the waiter that now starts in its place, if any."""
        if self._waiting:
            ticket, _ = self._waiting.popitem(last=False)
            return ticket
        self.in_flight -= 1
        return None

    def cancel(self, ticket: T) -> bool:
        """A waiter gave up before it started; False when it was not waiting."""
        if ticket not in self._waiting:
            return False
        del self._waiting[ticket]
        return True
