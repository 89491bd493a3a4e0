"""Jittered exponential back-off (full jitter), with the randomness injectable."""

from __future__ import annotations

import random

import msgspec


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    initial_s: float = 0.05
    max_s: float = 2.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """A delay for the ``attempt``-th retry (1-based), uniformly in (0, cap]."""
        cap = min(self.max_s, self.initial_s * self.multiplier ** max(0, attempt - 1))
        return (rng or random).uniform(cap / 10, cap)


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the client retries placement, by the status of each answer."""

    # RESOURCE_EXHAUSTED (no slot): back off until a slot is had or the deadline passes.
    no_slot: Backoff = Backoff()
    # UNAVAILABLE: retry soon, a bounded number of times.
    unavailable: Backoff = Backoff(initial_s=0.1, max_s=1.0)
    unavailable_attempts: int = 10
    # ABORTED (slot uncertain): wait at least one slot TTL before retrying.
    slot_ttl_s: float = 5.0
    # FAILED_PRECONDITION on SubmitTask (slot expired or lost): reserve again.
    resubmit_attempts: int = 5
