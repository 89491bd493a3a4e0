"""The IO subsystem's sans-IO decisions, table by table."""

from __future__ import annotations

import pytest

from blockx_core.io import (
    Admit,
    AimdLimit,
    BackendAdmission,
    CacheKey,
    FixedLimit,
    GiveUp,
    IoRetryPolicy,
    IoWindow,
    QueueTimedOut,
    ReadCache,
    RetryAfter,
    RetryDecision,
    Singleflight,
    canonical_arguments,
)


def key(name: str, epoch: int = 0) -> CacheKey:
    return CacheKey("b", "get", canonical_arguments([name], {}), epoch)


# -- read cache ----------------------------------------------------------------


def test_canonical_arguments_ignore_keyword_order() -> None:
    assert canonical_arguments([1], {"a": 1, "b": 2}) == canonical_arguments([1], {"b": 2, "a": 1})


def test_canonical_arguments_tell_positions_apart() -> None:
    assert canonical_arguments([1, 2], {}) != canonical_arguments([2, 1], {})


def test_a_stored_immutable_answer_is_a_hit() -> None:
    cache = ReadCache(10_000)
    assert cache.put(key("a"), b"1", immutable=True)
    assert cache.get(key("a")) == b"1"
    assert (cache.hits, cache.misses) == (1, 0)


def test_a_mutable_answer_is_never_stored() -> None:
    cache = ReadCache(10_000)
    assert not cache.put(key("a"), b"1", immutable=False)
    assert cache.get(key("a")) is None
    assert cache.misses == 1


def test_an_answer_larger_than_the_cache_is_not_stored() -> None:
    cache = ReadCache(100)
    assert not cache.put(key("a"), b"x" * 100, immutable=True)
    assert cache.bytes_used == 0


def test_the_least_recently_used_entry_goes_first() -> None:
    size = ReadCache.entry_bytes(key("a"), b"1")
    cache = ReadCache(2 * size)
    cache.put(key("a"), b"1", immutable=True)
    cache.put(key("b"), b"2", immutable=True)
    cache.get(key("a"))  # a is now more recent than b
    cache.put(key("c"), b"3", immutable=True)
    assert key("b") not in cache
    assert key("a") in cache
    assert key("c") in cache
    assert cache.bytes_used == 2 * size
    assert cache.evictions == 1


def test_replacing_an_entry_keeps_the_accounting() -> None:
    cache = ReadCache(10_000)
    cache.put(key("a"), b"1", immutable=True)
    cache.put(key("a"), b"22", immutable=True)
    assert cache.bytes_used == ReadCache.entry_bytes(key("a"), b"22")
    assert len(cache) == 1


def test_a_new_epoch_drops_the_older_entries() -> None:
    cache = ReadCache(10_000)
    cache.put(key("a"), b"1", immutable=True)
    assert cache.set_epoch(1) == 1
    assert cache.bytes_used == 0
    assert cache.get(key("a", epoch=1)) is None


def test_an_answer_of_an_older_epoch_is_refused() -> None:
    cache = ReadCache(10_000)
    cache.set_epoch(2)
    assert not cache.put(key("a", epoch=1), b"1", immutable=True)
    assert cache.put(key("a", epoch=2), b"1", immutable=True)


# -- singleflight --------------------------------------------------------------


def test_the_first_arrival_leads_and_the_others_join() -> None:
    flights: Singleflight[str, int] = Singleflight()
    assert flights.arrive("k", 1)
    assert not flights.arrive("k", 2)
    assert not flights.arrive("k", 3)
    assert flights.arrive("other", 4)
    assert flights.complete("k") == [2, 3]
    assert flights.shared == 2


def test_after_completion_the_next_arrival_leads_again() -> None:
    flights: Singleflight[str, int] = Singleflight()
    flights.arrive("k", 1)
    flights.complete("k")
    assert flights.arrive("k", 2)
    assert not flights.in_flight("other")


# -- IO window -----------------------------------------------------------------


def test_the_window_admits_up_to_its_cap_then_queues_fifo() -> None:
    window: IoWindow[int] = IoWindow(2)
    assert [window.request(t) for t in range(4)] == [True, True, False, False]
    assert window.release() == 2
    assert window.release() == 3
    assert window.release() is None
    assert window.in_flight == 1


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    window: IoWindow[int] = IoWindow(1)
    window.request(0)
    window.request(1)
    window.request(2)
    assert window.cancel(1)
    assert not window.cancel(1)
    assert window.release() == 2


def test_a_newcomer_does_not_overtake_a_waiter() -> None:
    window: IoWindow[int] = IoWindow(1)
    window.request(0)
    window.request(1)
    assert window.release() == 1  # the slot goes to the waiter, not to a newcomer
    assert not window.request(2)


# -- admission -----------------------------------------------------------------


def test_admission_queues_beyond_the_limit_and_admits_on_completion() -> None:
    admission = BackendAdmission(FixedLimit(2), queue_timeout_ms=100)
    assert [admission.submit(t, now_ms=0) for t in range(4)] == [True, True, False, False]
    assert admission.complete(latency_us=1000, ok=True, now_ms=5) == [Admit(ticket=2, waited_ms=5)]
    assert admission.in_flight == 2
    assert admission.queued == 1


def test_a_request_queued_too_long_times_out_on_tick() -> None:
    admission = BackendAdmission(FixedLimit(1), queue_timeout_ms=100)
    admission.submit(0, now_ms=0)
    admission.submit(1, now_ms=10)
    admission.submit(2, now_ms=50)
    assert admission.next_deadline_ms() == 110
    assert admission.tick(now_ms=109) == []
    assert admission.tick(now_ms=110) == [QueueTimedOut(ticket=1, waited_ms=100)]
    assert admission.next_deadline_ms() == 150
    assert admission.in_flight == 1


def test_a_cancelled_queued_request_is_forgotten() -> None:
    admission = BackendAdmission(FixedLimit(1), queue_timeout_ms=100)
    admission.submit(0, now_ms=0)
    admission.submit(1, now_ms=0)
    assert admission.cancel(1)
    assert admission.next_deadline_ms() is None
    assert admission.complete(latency_us=1, ok=True, now_ms=1) == []


def test_complete_without_a_request_in_flight_is_misuse() -> None:
    with pytest.raises(ValueError, match="in flight"):
        BackendAdmission(FixedLimit(1), 10).complete(latency_us=1, ok=True, now_ms=0)


# -- AIMD ----------------------------------------------------------------------

AIMD_CASES = [
    # (samples: (latency_us, ok, in_flight, now_ms), expected limit)
    ([], 4),
    # slow start: +1 per fast success while the limit is in use
    ([(1000, True, 4, t) for t in range(4)], 8),
    # a sample with the limit mostly unused does not raise it
    ([(1000, True, 1, 0)], 4),
    # an error backs off (x0.8, floored)
    ([(1000, True, 4, 0), (1000, False, 4, 1)], 4),
    # latency over 1.5x the baseline backs off
    ([(1000, True, 4, 0)] * 4 + [(2000, True, 8, 10)], 6),
]


@pytest.mark.parametrize(("samples", "expected"), AIMD_CASES)
def test_aimd(samples: list[tuple[int, bool, int, int]], expected: int) -> None:
    limit = AimdLimit(min_limit=1, max_limit=64)
    for latency_us, ok, in_flight, now_ms in samples:
        limit.on_sample(latency_us=latency_us, ok=ok, in_flight=in_flight, now_ms=now_ms)
    assert limit.limit == expected


def test_aimd_backs_off_at_most_once_per_target_latency() -> None:
    limit = AimdLimit(initial=20, max_limit=64)
    limit.on_sample(latency_us=1000, ok=True, in_flight=20, now_ms=0)
    for _ in range(5):
        limit.on_sample(latency_us=1000, ok=False, in_flight=20, now_ms=100)
    assert limit.decreases == 1
    limit.on_sample(latency_us=1000, ok=False, in_flight=20, now_ms=102)
    assert limit.decreases == 2


def test_aimd_after_a_decrease_grows_by_one_per_window() -> None:
    limit = AimdLimit(initial=10, max_limit=64)
    limit.on_sample(latency_us=1000, ok=False, in_flight=10, now_ms=0)
    assert limit.limit == 8
    for t in range(7):
        limit.on_sample(latency_us=1000, ok=True, in_flight=8, now_ms=10 + t)
    assert limit.limit == 8  # 7 successes add 7 x ~1/8.4: not yet 1
    for t in range(2):
        limit.on_sample(latency_us=1000, ok=True, in_flight=8, now_ms=20 + t)
    assert limit.limit == 9


def test_fixed_limit_never_moves() -> None:
    limit = FixedLimit(3)
    limit.on_sample(latency_us=10**9, ok=False, in_flight=3, now_ms=0)
    assert limit.limit == 3


# -- retry policy ----------------------------------------------------------------

RETRY_CASES: list[tuple[int, bool, float, RetryDecision]] = [
    # (attempts so far, retryable, jitter, decision) with backoff 100, max 1000, 3 attempts
    (1, False, 0.5, GiveUp()),
    (1, True, 0.0, RetryAfter(delay_ms=50)),
    (1, True, 1.0, RetryAfter(delay_ms=100)),
    (2, True, 0.5, RetryAfter(delay_ms=150)),
    (3, True, 0.5, GiveUp()),
]


@pytest.mark.parametrize(("attempts", "retryable", "jitter", "expected"), RETRY_CASES)
def test_retry_policy(
    attempts: int, retryable: bool, jitter: float, expected: RetryDecision
) -> None:
    policy = IoRetryPolicy(max_attempts=3, backoff_ms=100, backoff_max_ms=1000)
    assert policy.decide(attempts=attempts, retryable=retryable, jitter=jitter) == expected


def test_the_back_off_is_capped() -> None:
    policy = IoRetryPolicy(max_attempts=20, backoff_ms=100, backoff_max_ms=400)
    decision = policy.decide(attempts=10, retryable=True, jitter=1.0)
    assert decision == RetryAfter(delay_ms=400)


def test_a_policy_without_attempts_is_misuse() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        IoRetryPolicy(max_attempts=0)


def test_aimd_settles_near_the_knee_of_a_backend_that_queues() -> None:
    """A backend whose latency is 2 ms x max(1, in_flight / 8)^2 serves the most per
    second at 8 in flight; run with the limit's own concurrency, AIMD settles there."""
    limit = AimdLimit(min_limit=1, max_limit=64)
    now_us = 0
    seen: list[int] = []
    for _ in range(3000):
        in_flight = limit.limit
        latency_us = int(2000 * max(1.0, in_flight / 8) ** 2)
        # One window's worth of requests completes per latency period.
        now_us += latency_us // in_flight
        limit.on_sample(latency_us=latency_us, ok=True, in_flight=in_flight, now_ms=now_us // 1000)
        seen.append(limit.limit)
    late = seen[1000:]
    assert min(late) >= 6
    assert max(late) <= 12
