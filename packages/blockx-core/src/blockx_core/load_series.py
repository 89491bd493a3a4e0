"""A process's load over the last minutes, sans-IO: the Worker page's time series.

The adapter samples its own counters every ``interval_ms`` (``sample``): totals
that only grow since the process started (calls finished, tasks failed) and the
most task slots in use during the interval. The series keeps the last
``max_points`` intervals, each with its own start and end, so a late sample (a
busy event loop) makes a longer interval, never a wrong rate; ``points`` adds the
interval in progress. Memory is O(``max_points``) whatever the load.
"""

from __future__ import annotations

from collections import deque

import msgspec

from blockx_core.errors import InvalidConfig

DEFAULT_INTERVAL_MS = 10_000
DEFAULT_POINTS = 60  # ten minutes at the default interval


class LoadTotals(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since the process started."""

    calls_finished: int = 0
    tasks_failed: int = 0


class LoadPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One interval ``[start_ms, end_ms)``: what happened in it."""

    start_ms: int
    end_ms: int
    slots_peak: int
    calls_finished: int
    tasks_failed: int

    @property
    def calls_per_s(self) -> float:
        span_ms = self.end_ms - self.start_ms
        return self.calls_finished * 1000 / span_ms if span_ms > 0 else 0.0


class LoadSeries:
    """See the module docstring; every method takes the time as an argument."""

    def __init__(
        self,
        now_ms: int,
        *,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        max_points: int = DEFAULT_POINTS,
    ) -> None:
        if interval_ms < 1:
            raise InvalidConfig("interval_ms", f"must be >= 1 (got {interval_ms})")
        if max_points < 1:
            raise InvalidConfig("max_points", f"must be >= 1 (got {max_points})")
        self._interval_ms = interval_ms
        self._start_ms = now_ms
        self._totals = LoadTotals()
        self._points: deque[LoadPoint] = deque(maxlen=max_points)

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    def next_sample_ms(self) -> int:
        """When the interval in progress is due to close."""
        return self._start_ms + self._interval_ms

    def sample(self, now_ms: int, totals: LoadTotals, slots_peak: int) -> None:
        """Close the interval in progress at ``now_ms`` and start the next."""
        self._points.append(self._point(now_ms, totals, slots_peak))
        self._start_ms = max(now_ms, self._start_ms)
        self._totals = totals

    def points(self, now_ms: int, totals: LoadTotals, slots_peak: int) -> tuple[LoadPoint, ...]:
        """The closed intervals, oldest first, then the one in progress until ``now_ms``."""
        return (*self._points, self._point(now_ms, totals, slots_peak))

    def _point(self, now_ms: int, totals: LoadTotals, slots_peak: int) -> LoadPoint:
        last = self._totals
        return LoadPoint(
            start_ms=self._start_ms,
            end_ms=max(now_ms, self._start_ms),
            slots_peak=slots_peak,
            calls_finished=max(0, totals.calls_finished - last.calls_finished),
            tasks_failed=max(0, totals.tasks_failed - last.tasks_failed),
        )
