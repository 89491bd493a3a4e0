"""A Worker's recent task error rate (the heartbeat's ``errorRate``), sans-IO.

``ErrorRateWindow`` counts successes and failures in ``buckets`` equal time
buckets of ``window_ms / buckets`` each, in a ring, so memory stays O(buckets)
however many outcomes are recorded. The window is bucket-aligned: ``rate(now)``
covers the bucket holding ``now`` and the ``buckets - 1`` before it, so an
outcome older than ``window_ms`` never counts and one newer than
``window_ms - bucket_ms`` always does; in between, it depends on where the
bucket edges fall.
"""

from __future__ import annotations

from blockx_core.errors import InvalidConfig


class ErrorRateWindow:
    """Failures / total over the last ``window_ms``. Every method takes ``now_ms``."""

    def __init__(self, window_ms: int = 60_000, buckets: int = 12) -> None:
        if buckets <= 0:
            raise InvalidConfig("buckets", f"must be > 0 (got {buckets})")
        if window_ms <= 0:
            raise InvalidConfig("window_ms", f"must be > 0 (got {window_ms})")
        if window_ms % buckets:
            raise InvalidConfig(
                "window_ms", f"must be a multiple of buckets={buckets} (got {window_ms})"
            )
        self._window_ms = window_ms
        self._bucket_ms = window_ms // buckets
        self._buckets = buckets
        # Slot i holds the bucket numbered epoch[i] (≡ i mod buckets); None: never used.
        self._epoch: list[int | None] = [None] * buckets
        self._successes = [0] * buckets
        self._failures = [0] * buckets

    @property
    def window_ms(self) -> int:
        return self._window_ms

    @property
    def bucket_ms(self) -> int:
        return self._bucket_ms

    def record(self, success: bool, now_ms: int) -> None:
        """Count one task outcome at ``now_ms``."""
        bucket = now_ms // self._bucket_ms
        slot = bucket % self._buckets
        epoch = self._epoch[slot]
        if epoch is None or epoch < bucket:
            # The slot holds a bucket that has left the window: reuse it.
            self._epoch[slot] = bucket
            self._successes[slot] = 0
            self._failures[slot] = 0
        elif epoch > bucket:
            # A late outcome whose bucket has already been reused: it is outside the
            # window of the newest outcome, so it would not count anyway.
            return
        if success:
            self._successes[slot] += 1
        else:
            self._failures[slot] += 1

    def rate(self, now_ms: int) -> float:
        """Failures / total in the window ending at ``now_ms``; 0.0 with no outcomes."""
        newest = now_ms // self._bucket_ms
        oldest = newest - self._buckets + 1
        failures = 0
        total = 0
        for slot, epoch in enumerate(self._epoch):
            if epoch is not None and oldest <= epoch <= newest:
                failures += self._failures[slot]
                total += self._failures[slot] + self._successes[slot]
        return failures / total if total else 0.0
