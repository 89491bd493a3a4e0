"""The client's retry policy: the one place that says how long and how often the
client retries placement and re-checks a task whose worker went quiet. Its waits
follow ``blockx_core.backoff.Backoff`` (exponential, equal jitter), the formula
every retry loop of the project uses; the caller draws the randomness."""

from __future__ import annotations

import msgspec

from blockx_core.backoff import Backoff

__all__ = ["Backoff", "RetryPolicy"]


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the client retries, by what went wrong. Every limit also ends at the
    caller's deadline (``deadline_s``), whichever comes first."""

    # RESOURCE_EXHAUSTED (no slot): back off until a slot is had or the deadline passes.
    no_slot: Backoff = Backoff()
    # UNAVAILABLE (the coordinator answers but is not ready), and a coordinator that
    # cannot be reached (refused, reset): the first retry is immediate, later ones
    # back off on this schedule.
    unavailable: Backoff = Backoff(initial_s=0.1, max_s=1.0)
    # UNAVAILABLE answers without a caller's deadline: this many attempts in a row,
    # then UnavailableError (with a deadline: until the deadline).
    unavailable_attempts: int = 10
    # An unreachable coordinator: keep trying this long when the caller set no
    # deadline (long enough to ride out a coordinator restart).
    unreachable_s: float = 10.0
    # ABORTED (slot uncertain): wait at least one slot TTL before retrying.
    slot_ttl_s: float = 5.0
    # FAILED_PRECONDITION on SubmitTask (slot expired or lost), or a worker that
    # refused the connection or was not ready: reserve again, this many times.
    resubmit_attempts: int = 5
    # A worker that cannot be reached while the client waits for its tasks: re-check
    # on this schedule for this long, then report the tasks WORKER_LOST.
    worker_recheck: Backoff = Backoff(initial_s=0.1, max_s=1.0)
    worker_unreachable_s: float = 5.0

    def unavailable_delay(self, attempt: int, draw: float) -> float:
        """The wait before the ``attempt``-th retry (1-based) of an unavailable or
        unreachable coordinator: none for the first, then back-off (``draw`` in
        [0, 1), as ``Backoff.delay`` takes it)."""
        return 0.0 if attempt <= 1 else self.unavailable.delay(attempt - 1, draw)
