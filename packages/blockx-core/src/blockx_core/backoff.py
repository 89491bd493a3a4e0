"""Exponential back-off with equal jitter: the one formula every retry loop uses.

The ceiling doubles (``multiplier``) per attempt from ``initial`` up to ``cap``; the
wait is half the ceiling plus a random share of the other half. The floor keeps a
retry from coming back at once, the random half spreads many retriers apart. The
randomness is an argument (``draw``, a number in [0, 1) the caller draws), so the
formula stays pure and tests pick the draw.
"""

from __future__ import annotations

import msgspec


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """A back-off schedule in seconds (or any one unit: the formula has none)."""

    initial_s: float = 0.05
    max_s: float = 2.0
    multiplier: float = 2.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt`` (1-based)."""
        return float(min(self.max_s, self.initial_s * self.multiplier ** max(0, attempt - 1)))

    def delay(self, attempt: int, draw: float) -> float:
        """The wait before retry number ``attempt`` (1-based): in [ceiling/2, ceiling)."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + ceiling / 2 * min(max(draw, 0.0), 1.0)
