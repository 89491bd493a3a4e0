"""DeadlineTimer: the one event-loop timer of an adapter around a sans-IO core.

The core says when it next needs a tick (``next_deadline_ms()``, the aioquic
way); the adapter arms this timer at that time after every batch of commands.
An armed timer that fires no later is kept, so arming is cheap on a hot path; a
timer that fires early only makes the callback re-arm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from blockx_server.runtime.clock import Clock


class DeadlineTimer:
    def __init__(self, clock: Clock, fire: Callable[[], None]) -> None:
        self._clock = clock
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._at_ms: int | None = None

    def arm(self, deadline_ms: int | None) -> None:
        """Fire at ``deadline_ms`` (Unix ms) unless armed for no later; None: nothing due."""
        if deadline_ms is None:
            return
        if self._at_ms is not None and self._at_ms <= deadline_ms:
            return
        if self._handle is not None:
            self._handle.cancel()
        delay_s = max(0, deadline_ms - self._clock.now_ms()) / 1000
        self._at_ms = deadline_ms
        self._handle = asyncio.get_running_loop().call_later(delay_s, self._fired)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._at_ms = None

    def _fired(self) -> None:
        self._handle = self._at_ms = None
        self._fire()
