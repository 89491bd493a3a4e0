"""How wide each ``eth_getLogs`` request of a selective ingest is: pure decisions,
no node, no clock (``now_ms`` is an argument), no sleep.

Providers bound a log query in different ways, and each says so in its own words
(``classify`` reads them):

* a count of results ("query returned more than 10000 results"), or a size of the
  answer ("Log response size exceeded ... this block range should work: [0x.., 0x..]",
  HTTP 413, an answer over RPC_MAX_RESPONSE_BYTES, a query that timed out on the
  node): the range held too many logs. ``TOO_MANY_LOGS``: split the range (to the
  range the provider suggests, when it suggests one that starts where the asked
  one did), and do not grow past the width that failed for the next
  ``SOFT_LIMIT_SUCCESSES`` answers (logs are denser in some stretches of a chain
  than in others, so this limit does not last). The logs the refused range held,
  judged from the last answer's density, bound the logs aimed at from then on:
  half of them (a provider's cap on results does not move);
* a number of blocks ("exceed maximum block range", "block range is too wide"):
  ``RANGE_TOO_WIDE``, a limit that does not move. The narrowest failing width is
  kept; the next widths search between the widest that worked and it, and the
  limit's number, when the message gives one, is believed at once;
* a rate limit (HTTP 429, "rate limit", "too many requests"): ``RATE_LIMITED``,
  wait ``Retry-After`` (at most ``MAX_WAIT_MS``) or, without one, a doubling
  wait, and ask the same range again; ``MAX_RATE_LIMITED`` in a row give up.

After every answer the width grows, as graph-node's block stream does: aimed at
``target_logs`` logs per request from the last answer's density, at most
``GROWTH`` times the last width, never above ``max_width``, a known block-range
limit, or a recent too-many-logs width.

``LogRanges.next(first, last, now_ms)`` says what to do about blocks
``first..last`` still to fetch: ``Ask(span)`` or ``Wait(until_ms)``, or
``GiveUp(reason)``.
"""

from __future__ import annotations

import enum
import re
from typing import Final

import msgspec

from blockx_core.backoff import Backoff

DEFAULT_WIDTH: Final = 10_000  # the first request's blocks: start wide
DEFAULT_MAX_WIDTH: Final = 50_000
DEFAULT_TARGET_LOGS: Final = 5_000  # half the 10,000 results many providers allow
GROWTH: Final = 4  # the most a width grows after one answer
SOFT_LIMIT_SUCCESSES: Final = 16
FIRST_WAIT_MS: Final = 500
MAX_WAIT_MS: Final = 60_000
# A rate limit without Retry-After: the back-off schedule's ceiling (this core draws
# no randomness, and one ingest asks one node: nothing to spread apart).
RATE_LIMIT_BACKOFF: Final = Backoff(initial_s=FIRST_WAIT_MS, max_s=MAX_WAIT_MS)
MAX_RATE_LIMITED: Final = 12


class Refusal(enum.StrEnum):
    TOO_MANY_LOGS = "too many logs"
    RANGE_TOO_WIDE = "block range too wide"
    RATE_LIMITED = "rate limited"


class Span(msgspec.Struct, frozen=True):
    """Blocks ``first..last``, both included."""

    first: int
    last: int

    @property
    def width(self) -> int:
        return self.last - self.first + 1


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """What a provider's refusal of a log query says."""

    refusal: Refusal
    suggested: Span | None = None  # TOO_MANY_LOGS: the range the provider offers
    limit: int | None = None  # RANGE_TOO_WIDE: the blocks a request may span
    retry_after_ms: int | None = None  # RATE_LIMITED


class Ask(msgspec.Struct, frozen=True):
    span: Span


class Wait(msgspec.Struct, frozen=True):
    until_ms: int


class GiveUp(msgspec.Struct, frozen=True):
    reason: str


Next = Ask | Wait | GiveUp

_TOO_MANY_WORDS: Final = (
    "more than 10000 results",
    "returned more than",
    "query returned more",
    "response size exceeded",
    "response size should not",
    "too many logs",
    "logs matched by query exceeds",
    "log query timed out",
    "query timeout exceeded",
    "context deadline exceeded",
)
_TOO_WIDE_WORDS: Final = (
    "exceed maximum block range",
    "exceeds maximum block range",
    "block range is too wide",
    "block range too wide",
    "block range too large",
    "block range limit",
    "range is too large",
    "range too large",
    "maximum block range",
    "max block range",
    "is limited to a",
)
_RATE_WORDS: Final = ("rate limit", "too many requests", "request rate", "exceeded the rps")
# "... this block range should work: [0x10, 0x2f]" (two quantities in brackets)
_SUGGESTED: Final = re.compile(r"\[\s*(0x[0-9a-fA-F]{1,16})\s*,\s*(0x[0-9a-fA-F]{1,16})\s*\]")
_NUMBER: Final = re.compile(r"(?<![0-9a-fA-Fx])(\d[\d,_]*)(\s*k\b)?")


def classify(
    message: str,
    *,
    http_status: int | None = None,
    retry_after_s: float | None = None,
    too_large: bool = False,
) -> Refused | None:
    """The refusal a failed ``eth_getLogs`` is, from the node's words, the HTTP
    status and whether the answer was over the client's size limit; None for any
    other failure (the caller's usual retry or error)."""
    lowered = message.lower()
    if http_status == 429 or any(w in lowered for w in _RATE_WORDS):
        wait = None
        if retry_after_s is not None and retry_after_s >= 0:
            wait = min(MAX_WAIT_MS, int(retry_after_s * 1000))
        return Refused(refusal=Refusal.RATE_LIMITED, retry_after_ms=wait)
    if too_large or http_status == 413 or any(w in lowered for w in _TOO_MANY_WORDS):
        found = _SUGGESTED.search(message)
        suggested = None
        if found is not None:
            first, last = int(found[1], 16), int(found[2], 16)
            suggested = Span(first, last) if first <= last else None
        return Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=suggested)
    if any(w in lowered for w in _TOO_WIDE_WORDS):
        return Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=_limit(lowered))
    return None


def _limit(lowered: str) -> int | None:
    """The block-range limit a message names ("... range: 5000", "a 10,000 range",
    "up to a 2k block range"); None when it names no number."""
    for found in _NUMBER.finditer(lowered):
        digits = found[1].replace(",", "").replace("_", "")
        if not digits.isdigit():
            continue
        number = int(digits) * (1000 if found[2] else 1)
        if 0 < number < 2**40:
            return number
    return None


class LogRanges:
    """The width of each log query, learnt from the provider's answers."""

    def __init__(
        self,
        *,
        width: int = DEFAULT_WIDTH,
        max_width: int = DEFAULT_MAX_WIDTH,
        target_logs: int = DEFAULT_TARGET_LOGS,
    ) -> None:
        if not 1 <= width <= max_width:
            raise ValueError(f"the first log range must be 1 to {max_width} blocks, got {width}")
        if target_logs < 1:
            raise ValueError(f"target_logs must be 1 or more, got {target_logs}")
        self.width = width
        self.max_width = max_width
        self.target_logs = target_logs
        # The narrowest width a block-range limit refused, and the widest that
        # worked below it: the limit lies between.
        self.too_wide: int | None = None
        self.widest_ok = 0
        # A width that held too many logs, kept for a few answers.
        self.soft_limit: int | None = None
        self.soft_left = 0
        self.density: float | None = None  # logs per block of the last answer
        self.not_before_ms = 0
        self.rate_limited = 0
        self.splits = 0
        self.requests = 0
        self.narrowest = width
        self.widest = 0

    @property
    def ceiling(self) -> int:
        """The widest a request may be now."""
        ceiling = self.max_width
        if self.too_wide is not None:
            ceiling = min(ceiling, self.too_wide - 1)
        if self.soft_limit is not None:
            ceiling = min(ceiling, self.soft_limit)
        return max(1, ceiling)

    def next(self, first: int, last: int, now_ms: int) -> Next:
        """What to ask for blocks ``first..last`` (``first <= last``)."""
        if first > last:
            raise ValueError(f"no blocks to ask for: {first}..{last}")
        if self.rate_limited > MAX_RATE_LIMITED:
            return GiveUp(f"rate limited {self.rate_limited} times in a row")
        if now_ms < self.not_before_ms:
            return Wait(self.not_before_ms)
        width = min(self.width, self.ceiling)
        return Ask(Span(first, min(last, first + width - 1)))

    def on_answer(self, span: Span, logs: int, now_ms: int) -> None:
        """``span`` was answered with ``logs`` logs: grow toward the target."""
        del now_ms  # answers carry no time; kept for a uniform interface
        self.requests += 1
        self.rate_limited = 0
        self.narrowest = min(self.narrowest, span.width)
        self.widest = max(self.widest, span.width)
        self.density = logs / span.width
        if self.too_wide is not None and span.width < self.too_wide:
            self.widest_ok = max(self.widest_ok, span.width)
        if self.soft_limit is not None:
            self.soft_left -= 1
            if self.soft_left <= 0:
                self.soft_limit = None
        aimed = None if logs == 0 else max(1, span.width * self.target_logs // logs)
        if span.width < self.width:
            # A piece cut short by the end of its range says nothing about wider
            # ones, unless its logs were too dense for the width.
            grown = self.width if aimed is None else min(self.width, aimed)
        else:
            grown = span.width * GROWTH if aimed is None else min(span.width * GROWTH, aimed)
        if self.too_wide is not None and grown >= self.too_wide:
            # Search between what worked and what did not.
            grown = (max(self.widest_ok, span.width) + self.too_wide) // 2
        self.width = max(1, min(grown, self.ceiling))

    def on_refused(self, span: Span, refused: Refused, now_ms: int) -> None:
        """``span`` was refused as ``refused`` says."""
        match refused.refusal:
            case Refusal.RATE_LIMITED:
                self.rate_limited += 1
                wait = refused.retry_after_ms
                if wait is None:
                    wait = int(RATE_LIMIT_BACKOFF.ceiling(self.rate_limited))
                self.not_before_ms = max(self.not_before_ms, now_ms + wait)
                return
            case Refusal.TOO_MANY_LOGS:
                self.splits += 1
                suggested = refused.suggested
                if (
                    suggested is not None
                    and suggested.first == span.first
                    and suggested.last < span.last
                ):
                    width = suggested.width
                else:
                    width = max(1, span.width // 2)
                if self.density:
                    held = int(self.density * span.width)
                    self.target_logs = max(1, min(self.target_logs, held // 2))
                self.soft_limit = max(1, span.width - 1)
                self.soft_left = SOFT_LIMIT_SUCCESSES
                self.width = max(1, min(width, self.ceiling))
            case Refusal.RANGE_TOO_WIDE:
                self.splits += 1
                too_wide = span.width
                if refused.limit is not None and refused.limit < span.width:
                    too_wide = refused.limit + 1
                if self.too_wide is None or too_wide < self.too_wide:
                    self.too_wide = too_wide
                if self.widest_ok >= self.too_wide:
                    self.widest_ok = 0
                if refused.limit is not None and refused.limit < span.width:
                    width = refused.limit
                elif self.widest_ok:
                    width = (self.widest_ok + self.too_wide) // 2
                else:
                    width = span.width // 2
                self.width = max(1, min(width, self.ceiling))

    def cannot_split(self, span: Span, refused: Refused) -> bool:
        """Whether ``refused`` leaves nothing narrower to ask: one block alone holds
        more logs than the provider answers at once."""
        return refused.refusal is not Refusal.RATE_LIMITED and span.width == 1
