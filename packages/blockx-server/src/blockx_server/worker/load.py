"""The Worker's load over the last minutes, for DescribeWorker: every
LOAD_INTERVAL_MS the sampler closes an interval of ``LoadSeries`` with the Worker's
own counters (calls finished, tasks failed) and the most slots in use during it.
One timer per interval, whatever the load; the series' size is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from blockx_core.load_series import DEFAULT_INTERVAL_MS, LoadPoint, LoadSeries, LoadTotals
from blockx_core.worker import WorkerCore
from blockx_server.runtime.clock import Clock

LOAD_INTERVAL_MS: Final = DEFAULT_INTERVAL_MS


class LoadSampler:
    def __init__(
        self,
        core: WorkerCore,
        totals: Callable[[], LoadTotals],
        clock: Clock,
        interval_ms: int = LOAD_INTERVAL_MS,
    ) -> None:
        self._core = core
        self._totals = totals
        self._clock = clock
        self._series = LoadSeries(clock.now_ms(), interval_ms=interval_ms)

    @property
    def interval_ms(self) -> int:
        return self._series.interval_ms

    async def run(self) -> None:
        series = self._series
        while True:
            # The wall clock may step: never sleep longer than one interval.
            wait_ms = min(series.interval_ms, series.next_sample_ms() - self._clock.now_ms())
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
                continue
            series.sample(self._clock.now_ms(), self._totals(), self._core.take_slots_peak())

    def points(self, now_ms: int) -> tuple[LoadPoint, ...]:
        return self._series.points(now_ms, self._totals(), self._core.slots_peak)
