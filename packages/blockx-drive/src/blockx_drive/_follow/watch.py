"""When follow last looked at the chain, and whether it may have missed part of it.

Follow compares its ledger with the chain over the window a reorg can reach
(``blockx_drive.ledger.reach``) on every start and after every gap in its
watching; this core says when a gap happened:

* ``UNREACHABLE``: the block database or the sink could not be read, then could
  again (follow waits with the attempts' back-off, ``RETRY_BACKOFF``, instead of
  ending);
* ``PAUSED``: two looks further apart than the pause bound (the process was
  stopped, the machine suspended, the event loop starved).

Pure: the adapter passes the wall-clock time as ``now_ms`` (which, unlike a
monotonic clock, also moves while the machine is suspended).
"""

from __future__ import annotations

import enum
from typing import Final

from blockx_client.attempts import RETRY_BACKOFF

# Looks are at most a poll interval apart (plus the work between them): a gap this
# much longer than the poll interval is a pause.
PAUSE_MS: Final = 10_000


class GapReason(enum.StrEnum):
    START = "start"  # follow (re)started: whatever happened while it was stopped
    UNREACHABLE = "unreachable"  # a database could not be read for a while
    PAUSED = "paused"  # no look for longer than the pause bound


class Watch:
    """The looks of one follow run, from its start at ``now_ms``."""

    def __init__(self, now_ms: int, *, poll_interval_ms: int) -> None:
        self._last_ms = now_ms
        self._pause_ms = PAUSE_MS + poll_interval_ms
        self._gap: GapReason | None = None
        self._failures = 0

    def due(self, now_ms: int) -> GapReason | None:
        """Why the ledger must be reconciled before this look, if it must."""
        if self._gap is not None:
            return self._gap
        if now_ms - self._last_ms > self._pause_ms:
            return GapReason.PAUSED
        return None

    def looked(self, now_ms: int) -> None:
        """A look went through, with the reconciliation ``due`` asked for."""
        self._last_ms = now_ms
        self._gap = None
        self._failures = 0

    def lost(self, draw: float) -> float:
        """A look failed (a database could not be read): the seconds to wait before
        the next one, for ``draw`` (in [0, 1))."""
        self._gap = GapReason.UNREACHABLE
        self._failures += 1
        return RETRY_BACKOFF.delay(self._failures, draw)
