"""The widths of a selective ingest's log queries, without a node or a clock: each
provider's refusal read, ranges split and grown again, rate limits waited out; and a
simulated provider with random limits over random chains (hypothesis): every block
asked exactly once, in order, whatever the limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_chain.ingest.log_ranges import (
    DEFAULT_WIDTH,
    FIRST_WAIT_MS,
    GROWTH,
    MAX_RATE_LIMITED,
    MAX_WAIT_MS,
    Ask,
    GiveUp,
    LogRanges,
    Refusal,
    Refused,
    Span,
    Wait,
    classify,
)

TOO_MANY = Refused(refusal=Refusal.TOO_MANY_LOGS)

CLASSIFY_CASES = [
    # (message, http status, retry-after s, over the size limit, expected)
    (
        "query returned more than 10000 results. Try with this block range [0x10, 0x2f].",
        None,
        None,
        False,
        Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=Span(0x10, 0x2F)),
    ),
    (
        "Log response size exceeded. You can make eth_getLogs requests with up to a 2K block "
        "range and no limit on the response size, or you can request any block range with a "
        "cap of 10K logs in the response. Based on your parameters, this block range should "
        "work: [0x0, 0x3e7]",
        None,
        None,
        False,
        Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=Span(0, 999)),
    ),
    # A suggested range upside down is no suggestion.
    (
        "Log response size exceeded. this block range should work: [0x20, 0x10]",
        None,
        None,
        False,
        TOO_MANY,
    ),
    (
        "exceed maximum block range: 5000",
        None,
        None,
        False,
        Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=5000),
    ),
    ("block range is too wide", None, None, False, Refused(refusal=Refusal.RANGE_TOO_WIDE)),
    (
        "eth_getLogs is limited to a 10,000 range",
        None,
        None,
        False,
        Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=10_000),
    ),
    ("the node at X answered HTTP 413: b''", 413, None, False, TOO_MANY),
    ("eth_getLogs: the answer is larger than 100 bytes", None, None, True, TOO_MANY),
    ("query timeout exceeded", None, None, False, TOO_MANY),
    (
        "the node at X answered HTTP 429: b'slow down'",
        429,
        2.5,
        False,
        Refused(refusal=Refusal.RATE_LIMITED, retry_after_ms=2500),
    ),
    (
        "daily request count exceeded, request rate limited",
        None,
        None,
        False,
        Refused(refusal=Refusal.RATE_LIMITED),
    ),
    # A Retry-After of an hour is bounded.
    (
        "HTTP 429",
        429,
        3600.0,
        False,
        Refused(refusal=Refusal.RATE_LIMITED, retry_after_ms=MAX_WAIT_MS),
    ),
    ("header not found", None, None, False, None),
    ("the node at X answered HTTP 503: b'busy'", 503, None, False, None),
]


@pytest.mark.parametrize(
    ("message", "status", "retry_after", "too_large", "expected"), CLASSIFY_CASES
)
def test_classify(
    message: str,
    status: int | None,
    retry_after: float | None,
    too_large: bool,
    expected: Refused | None,
) -> None:
    assert (
        classify(message, http_status=status, retry_after_s=retry_after, too_large=too_large)
        == expected
    )


def ask(ranges: LogRanges, first: int, last: int, now_ms: int = 0) -> Span:
    decision = ranges.next(first, last, now_ms)
    assert isinstance(decision, Ask), decision
    return decision.span


STEP_CASES = [
    # (first width, refusal of the first request, the next request's span)
    (1000, TOO_MANY, Span(0, 499)),
    (1000, Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=Span(0, 99)), Span(0, 99)),
    # A suggestion that does not start where the request did, or covers all of it,
    # is not honoured: the range is halved.
    (1000, Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=Span(5, 99)), Span(0, 499)),
    (1000, Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=Span(0, 5000)), Span(0, 499)),
    (1000, Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=300), Span(0, 299)),
    (1000, Refused(refusal=Refusal.RANGE_TOO_WIDE), Span(0, 499)),
    # A limit above what was asked is no limit of this request: halve.
    (1000, Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=5000), Span(0, 499)),
]


@pytest.mark.parametrize(("width", "refused", "expected"), STEP_CASES)
def test_a_refusal_narrows_the_next_request(width: int, refused: Refused, expected: Span) -> None:
    ranges = LogRanges(width=width)
    first = ask(ranges, 0, 100_000)
    assert first == Span(0, width - 1)
    ranges.on_refused(first, refused, 0)
    assert ask(ranges, 0, 100_000) == expected


def test_answers_grow_the_width_toward_the_target() -> None:
    ranges = LogRanges(width=100, max_width=50_000, target_logs=1000)
    span = ask(ranges, 0, 10**9)
    ranges.on_answer(span, 0, 0)  # no logs: grow by GROWTH
    assert ranges.width == 100 * GROWTH
    span = ask(ranges, span.last + 1, 10**9)
    ranges.on_answer(span, 800, 0)  # 2 logs a block: aim at 1000 logs
    assert ranges.width == 500
    span = ask(ranges, span.last + 1, 10**9)
    ranges.on_answer(span, 5000, 0)  # much denser: shrink to the aim
    assert ranges.width == 100


def test_a_piece_cut_short_by_its_range_keeps_the_width() -> None:
    ranges = LogRanges(width=10_000)
    span = ask(ranges, 0, 36)
    assert span == Span(0, 36)
    ranges.on_answer(span, 2, 0)
    assert ranges.width == 10_000


def test_a_block_range_limit_is_found_and_kept() -> None:
    """A provider refusing more than 700 blocks, saying no number: the widths
    search between what worked and what did not, and never pass the limit again."""
    ranges = LogRanges(width=10_000)
    at, asked = 0, []
    while at < 200_000:
        span = ask(ranges, at, 10**9)
        asked.append(span.width)
        if span.width > 700:
            ranges.on_refused(span, Refused(refusal=Refusal.RANGE_TOO_WIDE), 0)
            continue
        ranges.on_answer(span, 0, 0)
        at = span.last + 1
    refused = [w for w in asked if w > 700]
    assert len(refused) <= 12  # a binary search, not a crawl
    assert asked[-20:] == [w for w in asked[-20:] if w <= 700]
    assert 600 <= asked[-1] <= 700


def test_a_too_many_logs_limit_wears_off() -> None:
    ranges = LogRanges(width=4000, target_logs=10**9)
    span = ask(ranges, 0, 10**9)
    ranges.on_refused(span, TOO_MANY, 0)
    widths = []
    at = 0
    for _ in range(40):
        span = ask(ranges, at, 10**9)
        widths.append(span.width)
        ranges.on_answer(span, 0, 0)
        at = span.last + 1
    assert widths[0] == 2000
    assert max(widths[:16]) <= 3999  # the width that failed is not asked again soon
    assert max(widths) == ranges.max_width  # then it grows again


def test_rate_limits_wait_and_give_up() -> None:
    ranges = LogRanges(width=100)
    span = ask(ranges, 0, 1000, now_ms=0)
    ranges.on_refused(span, Refused(refusal=Refusal.RATE_LIMITED, retry_after_ms=3000), 0)
    assert ranges.next(0, 1000, 2999) == Wait(3000)
    assert ask(ranges, 0, 1000, now_ms=3000) == span  # the same range again
    # Without Retry-After: doubling waits from FIRST_WAIT_MS.
    now = 3000
    waits = []
    for _ in range(MAX_RATE_LIMITED - 1):
        ranges.on_refused(span, Refused(refusal=Refusal.RATE_LIMITED), now)
        decision = ranges.next(0, 1000, now)
        assert isinstance(decision, Wait)
        waits.append(decision.until_ms - now)
        now = decision.until_ms
    assert waits[:3] == [FIRST_WAIT_MS * 2, FIRST_WAIT_MS * 4, FIRST_WAIT_MS * 8]
    assert max(waits) == MAX_WAIT_MS
    ranges.on_refused(span, Refused(refusal=Refusal.RATE_LIMITED), now)
    assert isinstance(ranges.next(0, 1000, now + MAX_WAIT_MS), GiveUp)
    # An answer in between resets the count.
    fresh = LogRanges(width=100)
    for _ in range(MAX_RATE_LIMITED):
        fresh.on_refused(span, Refused(refusal=Refusal.RATE_LIMITED), 0)
    fresh.on_answer(span, 0, 0)
    assert isinstance(fresh.next(0, 1000, 10**9), Ask)


def test_one_block_cannot_be_split() -> None:
    ranges = LogRanges(width=1)
    span = ask(ranges, 7, 100)
    assert ranges.cannot_split(span, TOO_MANY)
    assert not ranges.cannot_split(span, Refused(refusal=Refusal.RATE_LIMITED))
    assert not LogRanges().cannot_split(Span(0, 1), TOO_MANY)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="first log range"):
        LogRanges(width=0)
    with pytest.raises(ValueError, match="first log range"):
        LogRanges(width=10, max_width=5)
    with pytest.raises(ValueError, match="no blocks"):
        LogRanges().next(5, 4, 0)


@settings(max_examples=80, deadline=None)
@given(
    logs=st.lists(st.integers(0, 60), min_size=1, max_size=400),
    range_limit=st.one_of(st.none(), st.integers(1, 300)),
    says_limit=st.booleans(),
    result_cap=st.one_of(st.none(), st.integers(60, 500)),
    suggests=st.booleans(),
    rate_every=st.one_of(st.none(), st.integers(2, 9)),
    width=st.integers(1, DEFAULT_WIDTH),
)
def test_a_provider_with_any_limits_gets_every_block_once(
    logs: list[int],
    range_limit: int | None,
    says_limit: bool,
    result_cap: int | None,
    suggests: bool,
    rate_every: int | None,
    width: int,
) -> None:
    """``logs[n]``: the logs of block n. The provider refuses a range wider than
    ``range_limit`` (naming it or not), one holding more than ``result_cap`` logs
    (suggesting the widest prefix that fits, or not), and every ``rate_every``-th
    request with a 429. Every block is answered exactly once, in order, and no
    request waits less than it was told."""
    ranges = LogRanges(width=width, max_width=DEFAULT_WIDTH, target_logs=100)
    last = len(logs) - 1
    at, now, requests, asks = 0, 0, 0, 0
    answered: list[Span] = []
    while at <= last:
        requests += 1
        assert requests < 50 * len(logs) + 200, "no progress"
        decision = ranges.next(at, last, now)
        if isinstance(decision, Wait):
            assert decision.until_ms > now
            now = decision.until_ms
            continue
        assert isinstance(decision, Ask)
        asks += 1
        span = decision.span
        assert span.first == at
        assert at <= span.last <= last
        if rate_every is not None and asks % rate_every == 0:
            ranges.on_refused(span, Refused(refusal=Refusal.RATE_LIMITED, retry_after_ms=10), now)
            continue
        if range_limit is not None and span.width > range_limit:
            limit = range_limit if says_limit else None
            ranges.on_refused(span, Refused(refusal=Refusal.RANGE_TOO_WIDE, limit=limit), now)
            continue
        held = sum(logs[span.first : span.last + 1])
        if result_cap is not None and held > result_cap:
            suggested = None
            if suggests:
                end, total = span.first, logs[span.first]
                while end < span.last and total + logs[end + 1] <= result_cap:
                    end += 1
                    total += logs[end]
                suggested = Span(span.first, end)
            refused = Refused(refusal=Refusal.TOO_MANY_LOGS, suggested=suggested)
            assert not ranges.cannot_split(span, refused)  # caps above any one block
            ranges.on_refused(span, refused, now)
            continue
        ranges.on_answer(span, held, now)
        answered.append(span)
        at = span.last + 1
    covered = [n for span in answered for n in range(span.first, span.last + 1)]
    assert covered == list(range(len(logs)))
    assert 1 <= ranges.width <= ranges.max_width
