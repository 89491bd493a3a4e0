"""Concurrency limits for one backend: how many requests it may have in flight.

``AimdLimit`` (the default) adapts to what the backend shows. Its rule:

- The baseline is the smallest latency seen (it forgets slowly, rising by
  ``1/baseline_memory`` of the gap per sample, so a backend that became slower for
  good is not held to its old best).
- The target is ``baseline * tolerance`` (default 1.5).
- A success within the target, while the limit is in use (at least half of it in
  flight), raises the limit by ``1 / limit``: about one more request per round trip
  of the whole window, TCP's additive increase. Until the first decrease it raises
  it by 1 instead (slow start: the limit doubles per round trip), so a backend is
  found out from a small ``initial`` limit (default 4), where its baseline latency
  is measured, without a slow climb.
- An error, or a latency over the target, multiplies the limit by ``backoff_ratio``
  (default 0.8), at most once per target latency: the samples of requests already in
  flight when the limit dropped say nothing new about the smaller limit. The drop is
  deep enough to take concurrency back below the point where latency started to
  rise, so every cycle re-measures the baseline and it cannot creep upwards.
- The limit stays within [min_limit, max_limit].

Latency grows once a backend queues internally; holding latency near its baseline
holds concurrency near the knee where throughput peaks, and errors (rate limits,
overload) back it off.

``FixedLimit`` never moves (benchmarks, and backends that must not adapt).
"""

from __future__ import annotations

import math
from typing import Protocol


class ConcurrencyLimit(Protocol):
    @property
    def limit(self) -> int: ...

    def on_sample(self, *, latency_us: int, ok: bool, in_flight: int, now_ms: int) -> None:
        """One finished request: its backend latency, whether it succeeded, and how
        many requests were in flight when it finished (itself included)."""
        ...


class FixedLimit:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def on_sample(self, *, latency_us: int, ok: bool, in_flight: int, now_ms: int) -> None:
        return None


class AimdLimit:
    def __init__(
        self,
        *,
        min_limit: int = 1,
        max_limit: int = 64,
        initial: int | None = None,
        tolerance: float = 1.5,
        backoff_ratio: float = 0.8,
        baseline_memory: int = 1000,
    ) -> None:
        if not 1 <= min_limit <= max_limit:
            raise ValueError("need 1 <= min_limit <= max_limit")
        if tolerance < 1 or not 0 < backoff_ratio < 1 or baseline_memory < 1:
            raise ValueError("need tolerance >= 1, 0 < backoff_ratio < 1, baseline_memory >= 1")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.tolerance = tolerance
        self.backoff_ratio = backoff_ratio
        self.baseline_memory = baseline_memory
        start = initial if initial is not None else min(max_limit, max(min_limit, 4))
        self._limit = float(min(max_limit, max(min_limit, start)))
        self.baseline_us: float | None = None
        self._last_decrease_ms: int | None = None
        self.increases = 0
        self.decreases = 0

    @property
    def limit(self) -> int:
        return max(self.min_limit, min(self.max_limit, math.floor(self._limit)))

    @property
    def target_us(self) -> float | None:
        return None if self.baseline_us is None else self.baseline_us * self.tolerance

    def on_sample(self, *, latency_us: int, ok: bool, in_flight: int, now_ms: int) -> None:
        latency = float(max(latency_us, 1))
        if ok:
            if self.baseline_us is None or latency < self.baseline_us:
                self.baseline_us = latency
            else:
                self.baseline_us += (latency - self.baseline_us) / self.baseline_memory
        target = self.target_us
        if ok and target is not None and latency <= target:
            if in_flight * 2 >= self.limit:
                step = 1.0 if self._last_decrease_ms is None else 1 / self._limit
                self._limit = min(float(self.max_limit), self._limit + step)
                self.increases += 1
            return
        cooldown_ms = (target or latency) / 1000
        if self._last_decrease_ms is not None and now_ms - self._last_decrease_ms < cooldown_ms:
            return
        self._last_decrease_ms = now_ms
        self._limit = max(float(self.min_limit), self._limit * self.backoff_ratio)
        self.decreases += 1
