"""Properties of the IO subsystem's decisions under arbitrary sequences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from blockx_core.io import (
    AimdLimit,
    BackendAdmission,
    CacheKey,
    FixedLimit,
    IoWindow,
    ReadCache,
    Singleflight,
    canonical_arguments,
)

# One cache operation: (kind, key number, answer size, immutable, epoch)
cache_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "epoch"]),
        st.integers(0, 15),
        st.integers(0, 300),
        st.booleans(),
        st.integers(0, 3),
    ),
    max_size=200,
)


@given(max_bytes=st.integers(0, 2000), ops=cache_ops)
def test_the_cache_stays_within_its_bytes_and_never_serves_a_mutable_read(
    max_bytes: int, ops: list[tuple[str, int, int, bool, int]]
) -> None:
    cache = ReadCache(max_bytes)
    # The answer each key was last stored with by an immutable put. A key is answered
    # only from there: a key only ever put as mutable never is. (An answer once
    # immutable stays so within its epoch, as a finalized height only grows, so a
    # later mutable put of the same key leaves it.)
    stored_immutable: dict[CacheKey, bytes] = {}
    for kind, number, size, immutable, epoch in ops:
        key = CacheKey("b", "get", canonical_arguments([number], {}), cache.epoch)
        match kind:
            case "put":
                value = bytes(size) if immutable else b"m" * size
                stored = cache.put(key, value, immutable=immutable)
                assert stored <= immutable
                if stored:
                    stored_immutable[key] = value
            case "get":
                answer = cache.get(key)
                if answer is not None:
                    assert answer == stored_immutable[key]
            case "epoch":
                cache.set_epoch(epoch)
                assert all(k.epoch == epoch for k, _ in cache.items())
        assert 0 <= cache.bytes_used <= max_bytes
        assert cache.bytes_used == sum(ReadCache.entry_bytes(k, v) for k, v in cache.items())


@given(keys=st.lists(st.integers(0, 5), max_size=100), completes=st.lists(st.integers(0, 5)))
def test_singleflight_sends_one_request_per_key_in_flight(
    keys: list[int], completes: list[int]
) -> None:
    flights: Singleflight[int, int] = Singleflight()
    leaders: dict[int, int] = {}
    handed_back = 0
    arrivals = 0
    for i, k in enumerate(keys):
        arrivals += 1
        if flights.arrive(k, i):
            assert k not in leaders
            leaders[k] = i
        if completes and i % 3 == 0:
            done = completes[i % len(completes)]
            handed_back += len(flights.complete(done)) + (done in leaders)
            leaders.pop(done, None)
    for k in list(leaders):
        handed_back += len(flights.complete(k)) + 1
    # Every arrival is answered exactly once: by leading or by being handed back.
    assert handed_back == arrivals
    assert flights.shared == arrivals - _leads(keys, completes)


def _leads(keys: list[int], completes: list[int]) -> int:
    in_flight: set[int] = set()
    leads = 0
    for i, k in enumerate(keys):
        if k not in in_flight:
            in_flight.add(k)
            leads += 1
        if completes and i % 3 == 0:
            in_flight.discard(completes[i % len(completes)])
    return leads


@given(cap=st.integers(1, 8), steps=st.lists(st.sampled_from(["req", "rel", "cancel"])))
def test_the_window_never_exceeds_its_cap_and_serves_fifo(cap: int, steps: list[str]) -> None:
    window: IoWindow[int] = IoWindow(cap)
    started: list[int] = []
    waiting: list[int] = []
    running = 0
    for ticket, step in enumerate(steps):
        if step == "req":
            if window.request(ticket):
                running += 1
            else:
                waiting.append(ticket)
        elif step == "rel" and running:
            nxt = window.release()
            if waiting:
                assert nxt == waiting.pop(0)
                started.append(nxt)
            else:
                assert nxt is None
                running -= 1
        elif step == "cancel" and waiting:
            assert window.cancel(waiting.pop())
        assert window.in_flight == running <= cap
        assert window.waiting == len(waiting)


latencies = st.lists(
    st.tuples(st.integers(1, 200_000), st.booleans(), st.integers(1, 80)), max_size=300
)


@given(low=st.integers(1, 8), span=st.integers(0, 64), samples=latencies)
def test_aimd_stays_within_its_bounds(
    low: int, span: int, samples: list[tuple[int, bool, int]]
) -> None:
    limit = AimdLimit(min_limit=low, max_limit=low + span)
    for now_ms, (latency_us, ok, in_flight) in enumerate(samples):
        limit.on_sample(latency_us=latency_us, ok=ok, in_flight=in_flight, now_ms=now_ms * 10)
        assert low <= limit.limit <= low + span


@given(start=st.integers(2, 64), errors=st.integers(1, 30))
def test_aimd_decreases_on_errors(start: int, errors: int) -> None:
    limit = AimdLimit(min_limit=1, max_limit=64, initial=start)
    for i in range(errors):
        limit.on_sample(latency_us=1000, ok=False, in_flight=start, now_ms=i * 1000)
    assert limit.limit < start


@given(start=st.integers(1, 32), fast=st.integers(64, 500))
def test_aimd_rises_while_the_backend_stays_fast(start: int, fast: int) -> None:
    limit = AimdLimit(min_limit=1, max_limit=64, initial=start)
    for i in range(fast):
        limit.on_sample(latency_us=1000, ok=True, in_flight=limit.limit, now_ms=i)
    assert limit.limit > start


@given(limit=st.integers(1, 8), ops=st.lists(st.sampled_from(["submit", "done", "tick"])))
def test_admission_never_exceeds_the_limit(limit: int, ops: list[str]) -> None:
    admission = BackendAdmission(FixedLimit(limit), queue_timeout_ms=30)
    now = 0
    for ticket, op in enumerate(ops):
        now += 7
        if op == "submit":
            admission.submit(ticket, now)
        elif op == "done" and admission.in_flight:
            admission.complete(latency_us=100, ok=True, now_ms=now)
        else:
            for timed_out in admission.tick(now):
                assert timed_out.waited_ms >= 30
        assert admission.in_flight <= limit
        deadline = admission.next_deadline_ms()
        assert (deadline is None) == (admission.queued == 0)
