"""IoRetryPolicy: whether a Builder's read or a Writer's write is tried again, and when.

Only a retryable failure is retried, at most ``max_attempts`` attempts in all. The
wait is ``blockx_core.backoff.Backoff``'s: doubling per attempt from ``backoff_ms``
up to ``backoff_max_ms``, with equal jitter: half of it fixed, half scaled by
``jitter`` (a number in [0, 1) the caller draws), so retries of many tasks spread
out but never come back at once.
"""

from __future__ import annotations

import msgspec

from blockx_core.backoff import Backoff


class RetryAfter(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    delay_ms: int


class GiveUp(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


RetryDecision = RetryAfter | GiveUp


class IoRetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_attempts: int = 3
    backoff_ms: int = 50
    backoff_max_ms: int = 1000

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError("need max_attempts >= 1 and 0 <= backoff_ms <= backoff_max_ms")

    def decide(self, *, attempts: int, retryable: bool, jitter: float) -> RetryDecision:
        """After ``attempts`` failed attempts (the last one ``retryable`` or not)."""
        if not retryable or attempts >= self.max_attempts:
            return GiveUp()
        backoff = Backoff(initial_s=self.backoff_ms, max_s=self.backoff_max_ms, multiplier=2.0)
        return RetryAfter(delay_ms=int(backoff.delay(attempts, jitter)))
