"""ErrorRateWindow: failures / total over a bucketed, bucket-aligned time window."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.error_rate import ErrorRateWindow
from blockx_core.errors import InvalidConfig

OK = True
FAIL = False

# (outcomes as (success, at_ms) in recording order, query_ms, expected rate)
# with the default window: 60 s in 12 buckets of 5 s.
CASES: list[tuple[list[tuple[bool, int]], int, float]] = [
    ([], 0, 0.0),
    ([(FAIL, 0)], 0, 1.0),
    ([(OK, 0)], 0, 0.0),
    ([(OK, 0), (OK, 1), (OK, 2), (FAIL, 3)], 3, 0.25),
    ([(OK, 0), (FAIL, 30_000)], 30_000, 0.5),
    # The oldest bucket still counts until the window moves past it...
    ([(FAIL, 0)], 59_999, 1.0),
    # ...and then drops out entirely.
    ([(FAIL, 0)], 60_000, 0.0),
    ([(FAIL, 4_999)], 64_999, 0.0),
    ([(FAIL, 5_000)], 64_999, 1.0),
    # A reused slot forgets its old bucket.
    ([(FAIL, 0), (OK, 60_000)], 60_000, 0.0),
    ([(FAIL, 0), (FAIL, 1), (OK, 60_001), (FAIL, 65_000)], 65_000, 0.5),
    # Outcomes recorded after the query moment do not count.
    ([(FAIL, 10_000), (OK, 20_000)], 10_000, 1.0),
    # A late outcome still inside the window counts...
    ([(OK, 10_000), (FAIL, 5_000)], 10_000, 0.5),
    # ...one whose slot has moved on is dropped, and does not wipe the newer bucket.
    ([(OK, 60_000), (FAIL, 0)], 60_000, 0.0),
    ([(OK, 60_000), (FAIL, 0)], 0, 0.0),
]


@pytest.mark.parametrize(("outcomes", "query_ms", "expected"), CASES)
def test_rate(outcomes: list[tuple[bool, int]], query_ms: int, expected: float) -> None:
    window = ErrorRateWindow()
    for success, at_ms in outcomes:
        window.record(success, at_ms)
    assert window.rate(query_ms) == expected


def test_one_bucket_is_aligned_to_the_window() -> None:
    window = ErrorRateWindow(window_ms=1_000, buckets=1)
    window.record(False, 999)
    assert window.rate(999) == 1.0
    # 1 ms later the single bucket has ended: bucket granularity, as documented.
    assert window.rate(1_000) == 0.0


def test_defaults() -> None:
    window = ErrorRateWindow()
    assert (window.window_ms, window.bucket_ms) == (60_000, 5_000)


@pytest.mark.parametrize(
    ("window_ms", "buckets", "field"),
    [(60_000, 0, "buckets"), (0, 12, "window_ms"), (-5, 1, "window_ms"), (1_000, 3, "window_ms")],
)
def test_invalid_config(window_ms: int, buckets: int, field: str) -> None:
    with pytest.raises(InvalidConfig, match=f"^{field} "):
        ErrorRateWindow(window_ms=window_ms, buckets=buckets)


def _brute_rate(outcomes: list[tuple[bool, int]], since_ms: int, now_ms: int) -> float:
    kept = [success for success, at_ms in outcomes if since_ms <= at_ms <= now_ms]
    return kept.count(False) / len(kept) if kept else 0.0


@given(
    shape=st.sampled_from([(1_000, 1), (1_000, 4), (60_000, 12), (12, 12), (300, 10)]),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 2_000)), max_size=60),
    start_ms=st.integers(-(10**6), 10**12),
    query_delay_ms=st.integers(0, 3_000),
)
def test_rate_matches_brute_force_within_a_bucket(
    shape: tuple[int, int],
    steps: list[tuple[bool, int]],
    start_ms: int,
    query_delay_ms: int,
) -> None:
    window_ms, buckets = shape
    window = ErrorRateWindow(window_ms=window_ms, buckets=buckets)
    outcomes: list[tuple[bool, int]] = []
    at_ms = start_ms
    for success, gap_ms in steps:
        at_ms += gap_ms
        window.record(success, at_ms)
        outcomes.append((success, at_ms))
    now_ms = at_ms + query_delay_ms
    # The true window starts at now - window_ms + 1; the bucketed one may start up to
    # one bucket later. Any cutoff in that range is acceptable.
    earliest = now_ms - window_ms + 1
    latest = earliest + window.bucket_ms - 1
    cutoffs = {earliest} | {t for _, t in outcomes if earliest <= t <= latest}
    acceptable = {_brute_rate(outcomes, cutoff, now_ms) for cutoff in cutoffs}
    # Past the boundary bucket, the cutoff is also the first moment with no outcomes.
    acceptable.add(_brute_rate(outcomes, latest + 1, now_ms))
    rate = window.rate(now_ms)
    assert 0.0 <= rate <= 1.0
    assert rate in acceptable
