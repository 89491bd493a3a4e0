"""CoordinatorConfig and CoordinatorCore: readiness, filters, ranking, breaker, watch grace.

Time is an integer argument everywhere: tests move ``now`` by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pytest

from blockx_core.coordinator import (
    Candidate,
    CoordinatorConfig,
    CoordinatorCore,
    validate_reserve_request,
)
from blockx_core.errors import BlockxUsageError, ErrorCode, InvalidConfig, Refusal
from blockx_core.heartbeat import InvalidHeartbeat, WorkerHeartbeat, decode_heartbeat

NOW = 1_000_000
TIMEOUT = 10_000  # default heartbeat_timeout_ms
GRACE = 10_000  # default watch_grace_period_ms
COOLDOWN = 10_000  # default circuit_breaker_cooldown_ms
THRESHOLD = 3  # default circuit_breaker_threshold

UNAVAILABLE = ErrorCode.UNAVAILABLE
NO_SLOT = ErrorCode.NO_EXECUTABLE_SLOT

# Long heartbeat timeout: tests about the breaker and the watch move time far without
# re-sending heartbeats.
LONG = CoordinatorConfig(heartbeat_timeout_ms=1_000_000)


def hb(
    addr: str,
    *,
    slots: int = 4,
    reserved: int = 0,
    running: int = 0,
    cpu: float = 0.0,
    mem: float = 0.0,
    err: float = 0.0,
    last: int = NOW,
) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_addr=addr,
        task_slots=slots,
        reserved_slots=reserved,
        running_tasks=running,
        cpu_percent=cpu,
        memory_percent=mem,
        error_rate=err,
        last_heartbeat_ms=last,
    )


def make_core(
    *heartbeats: WorkerHeartbeat, config: CoordinatorConfig | None = None, now: int = NOW
) -> CoordinatorCore:
    core = CoordinatorCore(config)
    core.apply_full_worker_list(heartbeats, now)
    return core


def pick(core: CoordinatorCore, now: int = NOW, exclude: Iterable[str] = ()) -> str:
    """The chosen address, or the error code as a string."""
    result = core.select_candidate("task-1", frozenset(exclude), now)
    if isinstance(result, Candidate):
        return result.worker_addr
    assert isinstance(result, Refusal)
    return str(result.code)


def order(core: CoordinatorCore, now: int = NOW) -> list[str]:
    """Every selectable worker in ranking order (select, exclude, repeat)."""
    seen: list[str] = []
    while True:
        result = core.select_candidate("task-1", frozenset(seen), now)
        if not isinstance(result, Candidate):
            assert result.code is NO_SLOT
            return seen
        assert result.worker_addr not in seen
        seen.append(result.worker_addr)


def local(core: CoordinatorCore, addr: str) -> tuple[int, float, int]:
    view = core.worker(addr)
    assert view is not None
    return (view.recent_failure_count, view.penalty, view.circuit_breaker_deadline_ms)


def disconnected_at(core: CoordinatorCore) -> int | None:
    # A function, not the property, so that mypy does not keep a narrowed type across calls.
    return core.watch_disconnected_at_ms


# ==== CoordinatorConfig ====


def test_default_config_matches_the_specification() -> None:
    cfg = CoordinatorConfig()
    assert cfg.heartbeat_timeout_ms == 10_000
    assert cfg.watch_grace_period_ms == 10_000
    assert cfg.slot_ttl_ms == 5_000
    assert cfg.max_candidates == 3
    assert cfg.circuit_breaker_threshold == 3
    assert cfg.circuit_breaker_cooldown_ms == 10_000
    assert (cfg.cpu_red_line, cfg.memory_red_line, cfg.error_rate_red_line) == (0.9, 0.9, 0.5)
    cfg.validate()


INVALID_CONFIG: list[tuple[dict[str, Any], str]] = [
    ({"heartbeat_timeout_ms": 0}, "heartbeat_timeout_ms"),
    ({"heartbeat_timeout_ms": -1}, "heartbeat_timeout_ms"),
    ({"watch_grace_period_ms": 0}, "watch_grace_period_ms"),
    ({"watch_grace_period_ms": -5}, "watch_grace_period_ms"),
    ({"slot_ttl_ms": 0}, "slot_ttl_ms"),
    ({"slot_ttl_ms": -1}, "slot_ttl_ms"),
    ({"circuit_breaker_cooldown_ms": 0}, "circuit_breaker_cooldown_ms"),
    ({"circuit_breaker_cooldown_ms": -1}, "circuit_breaker_cooldown_ms"),
    ({"max_candidates": 0}, "max_candidates"),
    ({"max_candidates": -1}, "max_candidates"),
    ({"circuit_breaker_threshold": 0}, "circuit_breaker_threshold"),
    ({"circuit_breaker_threshold": -3}, "circuit_breaker_threshold"),
    ({"cpu_red_line": 0.0}, "cpu_red_line"),
    ({"cpu_red_line": -0.1}, "cpu_red_line"),
    ({"cpu_red_line": 1.01}, "cpu_red_line"),
    ({"cpu_red_line": math.nan}, "cpu_red_line"),
    ({"cpu_red_line": 90.0}, "cpu_red_line"),
    ({"memory_red_line": 0.0}, "memory_red_line"),
    ({"memory_red_line": 1.01}, "memory_red_line"),
    ({"memory_red_line": math.inf}, "memory_red_line"),
    ({"error_rate_red_line": 0.0}, "error_rate_red_line"),
    ({"error_rate_red_line": 1.01}, "error_rate_red_line"),
    ({"error_rate_red_line": -1.0}, "error_rate_red_line"),
    ({"watch_grace_period_ms": 10_001}, "watch_grace_period_ms"),
    ({"heartbeat_timeout_ms": 9_999}, "watch_grace_period_ms"),
    ({"heartbeat_timeout_ms": 100, "watch_grace_period_ms": 101}, "watch_grace_period_ms"),
]


@pytest.mark.parametrize(("changes", "field"), INVALID_CONFIG)
def test_config_validate_rejects(changes: dict[str, Any], field: str) -> None:
    cfg = CoordinatorConfig(**changes)
    with pytest.raises(InvalidConfig) as info:
        cfg.validate()
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, BlockxUsageError)


@pytest.mark.parametrize(("changes", "field"), INVALID_CONFIG[:3])
def test_core_refuses_invalid_config(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        CoordinatorCore(CoordinatorConfig(**changes))
    assert info.value.field == field


VALID_CONFIG: list[dict[str, Any]] = [
    {},
    {"heartbeat_timeout_ms": 1, "watch_grace_period_ms": 1},
    {"slot_ttl_ms": 1, "circuit_breaker_cooldown_ms": 1},
    {"max_candidates": 1, "circuit_breaker_threshold": 1},
    {"cpu_red_line": 1.0, "memory_red_line": 1.0, "error_rate_red_line": 1.0},
    {"cpu_red_line": 1e-9, "memory_red_line": 0.01, "error_rate_red_line": 0.001},
    {"watch_grace_period_ms": 10_000, "heartbeat_timeout_ms": 10_000},
    {"watch_grace_period_ms": 1, "heartbeat_timeout_ms": 1_000_000},
]


@pytest.mark.parametrize("changes", VALID_CONFIG)
def test_config_validate_accepts(changes: dict[str, Any]) -> None:
    cfg = CoordinatorConfig(**changes)
    cfg.validate()
    core = CoordinatorCore(cfg)
    assert core.config == cfg
    assert core.slot_ttl_ms == cfg.slot_ttl_ms


# ==== validate_reserve_request ====


def test_validate_reserve_request() -> None:
    err = validate_reserve_request("")
    assert isinstance(err, Refusal)
    assert err.code is ErrorCode.INVALID_ARGUMENT
    assert "task_id" in err.message
    assert validate_reserve_request("t") is None
    assert validate_reserve_request("  ") is None  # any non-empty id; the Worker owns it


# ==== readiness ====


def test_not_initialized_is_unavailable_even_with_updates() -> None:
    core = CoordinatorCore()
    assert not core.initialized
    assert not core.is_ready(NOW)
    core.apply_worker_update(hb("a"), NOW)
    result = core.select_candidate("t", frozenset(), NOW)
    assert isinstance(result, Refusal)
    assert result.code is UNAVAILABLE
    assert "not initialized" in result.message
    assert not core.is_ready(NOW)


def test_initialized_empty_is_unavailable_but_ready() -> None:
    core = make_core()
    assert core.initialized
    assert core.is_ready(NOW)
    assert pick(core) == UNAVAILABLE


def test_first_full_list_makes_updates_count() -> None:
    core = CoordinatorCore()
    core.apply_worker_update(hb("a"), NOW)
    core.apply_full_worker_list([hb("b")], NOW)
    assert core.worker("a") is None
    assert pick(core) == "b"


def test_initialized_never_reverts() -> None:
    core = make_core(hb("a"), config=LONG)
    core.apply_worker_removal("a", NOW)
    assert core.initialized
    core.apply_full_worker_list([], NOW)
    assert core.initialized
    core.mark_watch_disconnected(NOW)
    assert not core.is_ready(NOW + GRACE + 1)
    core.mark_watch_reconnected(NOW + GRACE + 1)
    assert core.initialized
    assert core.is_ready(NOW + GRACE + 1)
    core.apply_worker_update(hb("b"), NOW + GRACE + 1)
    assert pick(core, NOW + GRACE + 1) == "b"


def test_task_id_takes_no_part_in_the_choice() -> None:
    core = make_core(hb("a"), hb("b"), hb("c"))
    results = {core.select_candidate(t, frozenset(), NOW) for t in ["x", "y", "task-42"]}
    assert results == {Candidate("a")}


# ==== filters, one by one ====

# "w" ranks first whenever it survives the filters (4 free slots); "z" (1 free slot) is
# always routable, so the answer is "w" when w is kept and "z" when w is filtered.
FILTERS: list[tuple[str, dict[str, Any], frozenset[str], str]] = [
    # (id, heartbeat fields of w, exclude, expected)
    ("baseline", {}, frozenset(), "w"),
    ("excluded", {}, frozenset({"w"}), "z"),
    ("excluded-other", {}, frozenset({"z", "unknown"}), "w"),
    ("fresh-1ms-before-timeout", {"last": NOW - TIMEOUT + 1}, frozenset(), "w"),
    ("fresh-exactly-at-timeout", {"last": NOW - TIMEOUT}, frozenset(), "w"),
    ("stale-1ms-after-timeout", {"last": NOW - TIMEOUT - 1}, frozenset(), "z"),
    ("stale-long-ago", {"last": 0}, frozenset(), "z"),
    ("heartbeat-from-the-future", {"last": NOW + 5_000}, frozenset(), "w"),
    ("cpu-below-red-line", {"cpu": 0.89}, frozenset(), "w"),
    ("cpu-exactly-red-line", {"cpu": 0.9}, frozenset(), "w"),
    ("cpu-just-above-red-line", {"cpu": math.nextafter(0.9, 1.0)}, frozenset(), "z"),
    ("cpu-full", {"cpu": 1.0}, frozenset(), "z"),
    ("mem-exactly-red-line", {"mem": 0.9}, frozenset(), "w"),
    ("mem-just-above-red-line", {"mem": math.nextafter(0.9, 1.0)}, frozenset(), "z"),
    ("mem-full", {"mem": 1.0}, frozenset(), "z"),
    ("err-exactly-red-line", {"err": 0.5}, frozenset(), "w"),
    ("err-just-above-red-line", {"err": math.nextafter(0.5, 1.0)}, frozenset(), "z"),
    ("err-all", {"err": 1.0}, frozenset(), "z"),
    ("free-1", {"reserved": 3}, frozenset(), "w"),  # ties z on capacity, wins on address
    ("free-0-reserved", {"reserved": 4}, frozenset(), "z"),
    ("free-0-running", {"running": 4}, frozenset(), "z"),
    ("free-0-mixed", {"reserved": 2, "running": 2}, frozenset(), "z"),
    ("free-negative", {"reserved": 3, "running": 3}, frozenset(), "z"),
    ("zero-slots", {"slots": 0}, frozenset(), "z"),
    ("zero-slots-negative", {"slots": 0, "running": 1}, frozenset(), "z"),
]


@pytest.mark.parametrize(
    ("fields", "exclude", "expected"),
    [(f, e, x) for _, f, e, x in FILTERS],
    ids=[i for i, _, _, _ in FILTERS],
)
def test_each_filter(fields: dict[str, Any], exclude: frozenset[str], expected: str) -> None:
    core = make_core(hb("w", **fields), hb("z", slots=1))
    assert pick(core, NOW, exclude) == expected
    # The same answer when w arrives as an incremental update instead of in the list.
    core2 = make_core(hb("z", slots=1))
    core2.apply_worker_update(hb("w", **fields), NOW)
    assert pick(core2, NOW, exclude) == expected


def test_breaker_filter() -> None:
    core = make_core(hb("w"), hb("z", slots=1))
    for _ in range(THRESHOLD):
        core.record_slot_rejection("w", NOW)
    assert pick(core) == "z"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"cpu": 0.5}, "w"),
        ({"cpu": 0.51}, "z"),
        ({"mem": 0.5}, "w"),
        ({"mem": 0.51}, "z"),
        ({"err": 0.2}, "w"),
        ({"err": 0.21}, "z"),
    ],
)
def test_configured_red_lines(fields: dict[str, Any], expected: str) -> None:
    cfg = CoordinatorConfig(cpu_red_line=0.5, memory_red_line=0.5, error_rate_red_line=0.2)
    core = make_core(hb("w", **fields), hb("z", slots=1), config=cfg)
    assert pick(core) == expected


def test_configured_heartbeat_timeout() -> None:
    cfg = CoordinatorConfig(heartbeat_timeout_ms=100, watch_grace_period_ms=100)
    core = make_core(hb("w", last=NOW - 100), hb("z", slots=1), config=cfg)
    assert pick(core, NOW) == "w"
    assert pick(core, NOW + 1) == "z"


# ==== UNAVAILABLE versus NO_EXECUTABLE_SLOT ====

OUTCOMES: list[tuple[str, list[WorkerHeartbeat], frozenset[str], str]] = [
    # (id, workers, exclude, expected)
    ("all-stale", [hb("a", last=NOW - TIMEOUT - 1), hb("b", last=0)], frozenset(), UNAVAILABLE),
    ("one-exactly-at-timeout", [hb("a", last=NOW - TIMEOUT)], frozenset(), "a"),
    ("all-full", [hb("a", reserved=4), hb("b", slots=0)], frozenset(), NO_SLOT),
    (
        "all-overloaded",
        [hb("a", cpu=1.0), hb("b", mem=1.0), hb("c", err=1.0)],
        frozenset(),
        NO_SLOT,
    ),
    ("all-excluded", [hb("a"), hb("b")], frozenset({"a", "b"}), NO_SLOT),
    # An excluded worker's fresh heartbeat still says the view is live.
    ("fresh-excluded-rest-stale", [hb("a"), hb("b", last=0)], frozenset({"a"}), NO_SLOT),
    # A full worker with a fresh heartbeat also says the view is live.
    ("fresh-full-rest-stale", [hb("a", reserved=4), hb("b", last=0)], frozenset(), NO_SLOT),
    (
        "stale-but-routable-and-fresh-full",
        [hb("a", slots=0), hb("b", last=1)],
        frozenset(),
        NO_SLOT,
    ),
    ("stale-excluded-only", [hb("a", last=0)], frozenset({"a"}), UNAVAILABLE),
]


@pytest.mark.parametrize(
    ("workers", "exclude", "expected"),
    [(w, e, x) for _, w, e, x in OUTCOMES],
    ids=[i for i, _, _, _ in OUTCOMES],
)
def test_outcome(workers: list[WorkerHeartbeat], exclude: frozenset[str], expected: str) -> None:
    core = make_core(*workers)
    assert pick(core, NOW, exclude) == expected


def test_all_stale_message_and_recovery() -> None:
    core = make_core(hb("a", last=NOW - TIMEOUT - 1))
    result = core.select_candidate("t", frozenset(), NOW)
    assert isinstance(result, Refusal)
    assert result.code is UNAVAILABLE
    assert "no live worker" in result.message
    core.apply_worker_update(hb("a", last=NOW), NOW)
    assert pick(core) == "a"


def test_all_filtered_by_breaker_is_no_executable_slot() -> None:
    core = make_core(hb("a"))
    for _ in range(THRESHOLD):
        core.record_slot_timeout("a", NOW)
    result = core.select_candidate("t", frozenset(), NOW)
    assert isinstance(result, Refusal)
    assert result.code is NO_SLOT


# ==== ranking ====

# Workers: (addr, free capacity, heartbeat age in ms, failures before selecting).
Spec = tuple[str, int, int, int]
RANKING: list[tuple[str, list[Spec], list[str]]] = [
    ("more-free-first", [("a", 1, 0, 0), ("b", 3, 0, 0), ("c", 2, 0, 0)], ["b", "c", "a"]),
    ("then-newer-heartbeat", [("a", 2, 500, 0), ("b", 2, 0, 0), ("c", 2, 10, 0)], ["b", "c", "a"]),
    ("then-lower-penalty", [("a", 2, 0, 2), ("b", 2, 0, 0), ("c", 2, 0, 1)], ["b", "c", "a"]),
    ("then-smaller-address", [("c", 2, 0, 0), ("a", 2, 0, 0), ("b", 2, 0, 0)], ["a", "b", "c"]),
    ("free-beats-heartbeat", [("a", 3, 9_000, 0), ("b", 2, 0, 0)], ["a", "b"]),
    ("free-beats-penalty", [("a", 3, 0, 2), ("b", 2, 0, 0)], ["a", "b"]),
    ("free-beats-address", [("b", 3, 0, 0), ("a", 2, 0, 0)], ["b", "a"]),
    ("heartbeat-beats-penalty", [("a", 2, 0, 2), ("b", 2, 1, 0)], ["a", "b"]),
    ("heartbeat-beats-address", [("b", 2, 0, 0), ("a", 2, 1, 0)], ["b", "a"]),
    ("penalty-beats-address", [("a", 2, 0, 1), ("b", 2, 0, 0)], ["b", "a"]),
    (
        "all-rules",
        [
            ("e", 1, 0, 0),
            ("d", 2, 5, 0),
            ("c", 2, 0, 2),
            ("b", 2, 0, 1),
            ("a", 2, 0, 1),
            ("f", 4, 100, 2),
        ],
        ["f", "a", "b", "c", "d", "e"],
    ),
]


@pytest.mark.parametrize(
    ("specs", "expected"),
    [(s, e) for _, s, e in RANKING],
    ids=[i for i, _, _ in RANKING],
)
def test_ranking(specs: list[Spec], expected: list[str]) -> None:
    core = make_core(*(hb(addr, slots=free, last=NOW - age) for addr, free, age, _ in specs))
    for addr, _, _, failures in specs:
        for i in range(failures):
            # Alternate the two failure kinds: both count the same.
            (core.record_slot_rejection if i % 2 else core.record_slot_timeout)(addr, NOW)
    assert order(core) == expected


def test_ranking_follows_heartbeat_updates() -> None:
    core = make_core(hb("a", slots=2), hb("b", slots=3))
    assert pick(core) == "b"
    core.apply_worker_update(hb("b", slots=3, reserved=2), NOW)
    assert pick(core) == "a"
    core.apply_worker_update(hb("a", slots=2, last=NOW - 1), NOW)
    core.apply_worker_update(hb("b", slots=2), NOW)
    assert order(core) == ["b", "a"]


# ==== breaker and penalties ====


@pytest.mark.parametrize("kind", ["rejection", "timeout"])
def test_each_failure_adds_one(kind: str) -> None:
    core = make_core(hb("a"), config=LONG)
    record = core.record_slot_rejection if kind == "rejection" else core.record_slot_timeout
    record("a", NOW)
    assert local(core, "a") == (1, 1.0, 0)
    record("a", NOW)
    assert local(core, "a") == (2, 2.0, 0)
    assert pick(core) == "a"  # below the threshold: penalised, not filtered


@pytest.mark.parametrize(
    "kinds",
    [
        ("rejection", "rejection", "rejection"),
        ("timeout", "timeout", "timeout"),
        ("rejection", "timeout", "rejection"),
        ("timeout", "rejection", "timeout"),
    ],
)
def test_threshold_opens_breaker_until_cooldown(kinds: tuple[str, ...]) -> None:
    core = make_core(hb("a"), config=LONG)
    t = NOW + 123
    for i, kind in enumerate(kinds):
        record = core.record_slot_rejection if kind == "rejection" else core.record_slot_timeout
        record("a", t)
        if i < len(kinds) - 1:
            assert pick(core, t) == "a"
    deadline = t + COOLDOWN
    assert local(core, "a") == (3, 3.0, deadline)
    assert pick(core, t) == NO_SLOT
    assert pick(core, deadline - 1) == NO_SLOT
    assert pick(core, deadline) == "a"
    # Once released, going back before the deadline filters it again.
    assert pick(core, deadline - 1) == NO_SLOT
    assert pick(core, deadline + 1) == "a"


def test_breaker_deadline_skipped_over_without_intermediate_select() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    assert pick(core, NOW + 5 * COOLDOWN) == "a"


def test_threshold_one_trips_on_first_failure() -> None:
    cfg = CoordinatorConfig(heartbeat_timeout_ms=1_000_000, circuit_breaker_threshold=1)
    core = make_core(hb("a"), config=cfg)
    core.record_slot_timeout("a", NOW)
    assert local(core, "a") == (1, 1.0, NOW + COOLDOWN)
    assert pick(core, NOW) == NO_SLOT
    assert pick(core, NOW + COOLDOWN) == "a"


def test_configured_cooldown() -> None:
    cfg = CoordinatorConfig(heartbeat_timeout_ms=1_000_000, circuit_breaker_cooldown_ms=7)
    core = make_core(hb("a"), config=cfg)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    assert pick(core, NOW + 6) == NO_SLOT
    assert pick(core, NOW + 7) == "a"


def test_success_resets_count_penalty_and_deadline() -> None:
    core = make_core(hb("a"), hb("b", slots=1), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    assert pick(core, NOW + 1) == "b"
    core.record_slot_success("a", NOW + 1)
    assert local(core, "a") == (0, 0.0, 0)
    assert pick(core, NOW + 1) == "a"  # at once, long before the old deadline
    # The old deadline passing later changes nothing.
    assert pick(core, NOW + COOLDOWN) == "a"
    # The count restarts: two more failures do not trip the breaker.
    core.record_slot_rejection("a", NOW + 2)
    core.record_slot_rejection("a", NOW + 2)
    assert local(core, "a") == (2, 2.0, 0)
    assert pick(core, NOW + 2) == "a"  # penalised but not filtered; 4 free beats 1


def test_success_below_threshold_restores_rank() -> None:
    core = make_core(hb("a"), hb("b"), config=LONG)
    core.record_slot_rejection("a", NOW)
    assert order(core) == ["b", "a"]
    core.record_slot_success("a", NOW)
    assert local(core, "a") == (0, 0.0, 0)
    assert order(core) == ["a", "b"]


def test_after_cooldown_one_more_failure_retrips() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_timeout("a", NOW)
    first_deadline = NOW + COOLDOWN
    assert pick(core, first_deadline) == "a"
    # The cooldown does not reset the count: the next failure trips again at once.
    t = first_deadline + 50
    core.record_slot_rejection("a", t)
    assert local(core, "a") == (THRESHOLD + 1, float(THRESHOLD + 1), t + COOLDOWN)
    assert pick(core, t) == NO_SLOT
    assert pick(core, t + COOLDOWN - 1) == NO_SLOT
    assert pick(core, t + COOLDOWN) == "a"


def test_failure_while_open_extends_deadline() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.record_slot_rejection("a", NOW + 100)
    assert local(core, "a") == (4, 4.0, NOW + 100 + COOLDOWN)
    assert pick(core, NOW + COOLDOWN) == NO_SLOT
    assert pick(core, NOW + 100 + COOLDOWN - 1) == NO_SLOT
    assert pick(core, NOW + 100 + COOLDOWN) == "a"


def test_backpressure_changes_nothing() -> None:
    core = make_core(hb("a"), hb("b"), config=LONG)
    core.record_slot_rejection("a", NOW)
    before = local(core, "a")
    for _ in range(THRESHOLD * 3):
        core.record_slot_backpressure("a", NOW)
        core.record_slot_backpressure("b", NOW)
    assert local(core, "a") == before
    assert local(core, "b") == (0, 0.0, 0)
    assert order(core) == ["b", "a"]


def test_backpressure_does_not_release_an_open_breaker() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.record_slot_backpressure("a", NOW + 1)
    assert local(core, "a") == (3, 3.0, NOW + COOLDOWN)
    assert pick(core, NOW + 1) == NO_SLOT


@pytest.mark.parametrize("method", ["success", "rejection", "timeout", "backpressure"])
def test_feedback_for_unknown_worker_is_a_noop(method: str) -> None:
    core = make_core(hb("a"))
    getattr(core, f"record_slot_{method}")("ghost", NOW)
    assert core.worker("ghost") is None
    assert core.worker_count == 1
    assert local(core, "a") == (0, 0.0, 0)
    assert pick(core) == "a"


def test_feedback_for_removed_worker_does_not_resurrect_it() -> None:
    core = make_core(hb("a"), hb("b"))
    core.apply_worker_removal("a", NOW)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.record_slot_success("a", NOW)
    assert core.worker("a") is None
    assert order(core) == ["b"]


def test_heartbeat_update_does_not_close_an_open_breaker() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.apply_worker_update(hb("a", slots=8, last=NOW + 1), NOW + 1)
    assert local(core, "a") == (3, 3.0, NOW + COOLDOWN)
    assert pick(core, NOW + 1) == NO_SLOT
    assert pick(core, NOW + COOLDOWN) == "a"


# ==== watch grace ====

WATCH = CoordinatorConfig(heartbeat_timeout_ms=1_000_000, watch_grace_period_ms=GRACE)


def test_disconnect_records_only_the_first_time() -> None:
    core = make_core(hb("a"), config=WATCH)
    assert disconnected_at(core) is None
    core.mark_watch_disconnected(NOW)
    core.mark_watch_disconnected(NOW + 5_000)
    assert disconnected_at(core) == NOW
    # The grace is counted from the first disconnect.
    assert not core.is_ready(NOW + GRACE + 1)


@pytest.mark.parametrize(
    ("elapsed", "ready"),
    [
        (-1, True),
        (0, True),
        (1, True),
        (GRACE - 1, True),
        (GRACE, True),
        (GRACE + 1, False),
        (10 * GRACE, False),
    ],
)
def test_watch_grace(elapsed: int, ready: bool) -> None:
    core = make_core(hb("a"), config=WATCH)
    core.mark_watch_disconnected(NOW)
    now = NOW + elapsed
    assert core.is_ready(now) is ready
    result = core.select_candidate("t", frozenset(), now)
    if ready:
        assert result == Candidate("a")
    else:
        assert isinstance(result, Refusal)
        assert result.code is UNAVAILABLE
        assert "watch" in result.message


def test_reconnect_clears_the_disconnect() -> None:
    core = make_core(hb("a"), config=WATCH)
    core.mark_watch_disconnected(NOW)
    assert pick(core, NOW + GRACE + 1) == UNAVAILABLE
    core.mark_watch_reconnected(NOW + GRACE + 2)
    assert disconnected_at(core) is None
    assert core.is_ready(NOW + GRACE + 2)
    assert pick(core, NOW + GRACE + 2) == "a"
    # A later disconnect starts a new grace period from its own time.
    later = NOW + 5 * GRACE
    core.mark_watch_disconnected(later)
    assert disconnected_at(core) == later
    assert pick(core, later + GRACE) == "a"
    assert pick(core, later + GRACE + 1) == UNAVAILABLE


def test_reconnect_without_disconnect_is_harmless() -> None:
    core = make_core(hb("a"), config=WATCH)
    core.mark_watch_reconnected(NOW)
    assert disconnected_at(core) is None
    assert pick(core) == "a"


def test_not_initialized_wins_over_watch_grace() -> None:
    core = CoordinatorCore(WATCH)
    core.mark_watch_disconnected(NOW)
    result = core.select_candidate("t", frozenset(), NOW)
    assert isinstance(result, Refusal)
    assert result.code is UNAVAILABLE
    assert "not initialized" in result.message


def test_updates_during_grace_are_still_applied() -> None:
    core = make_core(hb("a", slots=1), config=WATCH)
    core.mark_watch_disconnected(NOW)
    core.apply_worker_update(hb("b", slots=3), NOW + GRACE + 5)
    assert pick(core, NOW + GRACE + 5) == UNAVAILABLE
    core.mark_watch_reconnected(NOW + GRACE + 6)
    assert pick(core, NOW + GRACE + 6) == "b"


# ==== full list, removal, updates ====


def test_full_list_preserves_local_fields_of_survivors() -> None:
    core = make_core(hb("a"), hb("b"), hb("c"), hb("d"), config=LONG)
    core.record_slot_rejection("a", NOW)
    core.record_slot_timeout("a", NOW)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("b", NOW)
    core.record_slot_rejection("d", NOW)
    t = NOW + 10
    core.apply_full_worker_list([hb("a", slots=5, last=t), hb("b", last=t), hb("e", last=t)], t)
    assert core.worker_count == 3
    assert core.worker("c") is None
    assert core.worker("d") is None
    assert local(core, "a") == (2, 2.0, 0)
    assert local(core, "b") == (3, 3.0, NOW + COOLDOWN)
    assert local(core, "e") == (0, 0.0, 0)
    view = core.worker("a")
    assert view is not None
    assert view.heartbeat.task_slots == 5  # the heartbeat itself is replaced
    # b's breaker is still open until its original deadline.
    assert order(core, t) == ["a", "e"]
    assert order(core, NOW + COOLDOWN - 1) == ["a", "e"]
    assert order(core, NOW + COOLDOWN) == ["a", "e", "b"]


def test_full_list_after_breaker_deadline_passed() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    assert pick(core, NOW + COOLDOWN) == "a"
    core.apply_full_worker_list([hb("a")], NOW + COOLDOWN + 1)
    assert pick(core, NOW + COOLDOWN + 1) == "a"
    # Not reset by the relist: the next failure re-trips.
    core.record_slot_rejection("a", NOW + COOLDOWN + 2)
    assert pick(core, NOW + COOLDOWN + 2) == NO_SLOT


def test_full_list_with_breaker_deadline_already_passed_at_apply_time() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    # No select between the trip and the relist; the relist comes after the deadline.
    core.apply_full_worker_list([hb("a")], NOW + 2 * COOLDOWN)
    assert pick(core, NOW + 2 * COOLDOWN) == "a"


def test_removed_by_full_list_then_readded_starts_from_zero() -> None:
    core = make_core(hb("a"), hb("b"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.apply_full_worker_list([hb("b")], NOW)
    core.apply_full_worker_list([hb("a"), hb("b")], NOW)
    assert local(core, "a") == (0, 0.0, 0)
    assert order(core, NOW) == ["a", "b"]


@pytest.mark.parametrize("readd", ["update", "full-list"])
def test_removal_then_readd_starts_from_zero(readd: str) -> None:
    core = make_core(hb("a"), hb("b"), config=LONG)
    for _ in range(THRESHOLD + 1):
        core.record_slot_rejection("a", NOW)
    core.apply_worker_removal("a", NOW + 1)
    assert core.worker("a") is None
    assert core.worker_count == 1
    assert order(core, NOW + 1) == ["b"]
    if readd == "update":
        core.apply_worker_update(hb("a"), NOW + 2)
    else:
        core.apply_full_worker_list([hb("a"), hb("b")], NOW + 2)
    assert local(core, "a") == (0, 0.0, 0)
    assert order(core, NOW + 2) == ["a", "b"]
    # The stale breaker of the old incarnation must not affect the new one.
    assert order(core, NOW + COOLDOWN) == ["a", "b"]
    # And the new incarnation needs the full threshold again.
    core.record_slot_rejection("a", NOW + 3)
    core.record_slot_rejection("a", NOW + 3)
    assert pick(core, NOW + 3, exclude={"b"}) == "a"


def test_removal_then_readd_then_retrip_uses_new_deadline() -> None:
    core = make_core(hb("a"), config=LONG)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW)
    core.apply_worker_removal("a", NOW)
    core.apply_worker_update(hb("a"), NOW + 500)
    for _ in range(THRESHOLD):
        core.record_slot_rejection("a", NOW + 500)
    # The old incarnation's deadline passing does not release the new breaker.
    assert pick(core, NOW + COOLDOWN) == NO_SLOT
    assert pick(core, NOW + 500 + COOLDOWN - 1) == NO_SLOT
    assert pick(core, NOW + 500 + COOLDOWN) == "a"


def test_removal_of_unknown_worker_is_a_noop() -> None:
    core = make_core(hb("a"))
    core.apply_worker_removal("ghost", NOW)
    assert core.worker_count == 1
    assert pick(core) == "a"


def test_removing_the_only_fresh_worker_makes_view_unavailable() -> None:
    core = make_core(hb("a"), hb("b", last=0))
    core.apply_worker_removal("a", NOW)
    assert pick(core) == UNAVAILABLE
    core.apply_worker_removal("b", NOW)
    assert pick(core) == UNAVAILABLE
    assert core.worker_count == 0


# (id, heartbeat fields that take "a" out of selection, fields that bring it back)
UPDATES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("full-reserved", {"reserved": 4}, {"reserved": 3}),
    ("full-running", {"running": 4}, {"running": 0}),
    ("over-full", {"reserved": 3, "running": 3}, {"reserved": 1, "running": 1}),
    ("slots-to-zero", {"slots": 0}, {"slots": 1}),
    ("cpu-over", {"cpu": 0.95}, {"cpu": 0.9}),
    ("mem-over", {"mem": 0.95}, {"mem": 0.2}),
    ("err-over", {"err": 0.6}, {"err": 0.5}),
    ("stale", {"last": NOW - TIMEOUT - 1}, {"last": NOW}),
]


@pytest.mark.parametrize(
    ("out", "back"),
    [(o, b) for _, o, b in UPDATES],
    ids=[i for i, _, _ in UPDATES],
)
def test_heartbeat_update_moves_worker_out_and_back(
    out: dict[str, Any], back: dict[str, Any]
) -> None:
    core = make_core(hb("a"), hb("b", slots=1))
    assert pick(core) == "a"
    core.apply_worker_update(hb("a", **out), NOW)
    assert pick(core) == "b"
    assert core.worker("a") is not None  # still known, just not routable
    core.apply_worker_update(hb("a", **back), NOW)
    assert pick(core) == "a"


def test_update_keeps_local_fields() -> None:
    core = make_core(hb("a"), config=LONG)
    core.record_slot_rejection("a", NOW)
    core.apply_worker_update(hb("a", slots=9), NOW)
    assert local(core, "a") == (1, 1.0, 0)


def test_workers_and_worker_inspection() -> None:
    core = make_core(hb("a"), hb("b"))
    assert sorted(v.worker_addr for v in core.workers()) == ["a", "b"]
    view = core.worker("a")
    assert view is not None
    assert view.heartbeat == hb("a")
    assert (view.used_total, view.free_capacity) == (0, 4)
    assert not view.breaker_open(NOW)
    assert "a" in repr(view)
    # workers() is a snapshot: mutating the core while iterating is safe.
    for v in core.workers():
        core.apply_worker_removal(v.worker_addr, NOW)
    assert core.worker_count == 0


def test_duplicate_address_in_full_list_last_one_wins() -> None:
    core = make_core(hb("a", slots=1), hb("a", slots=6), hb("b", slots=3))
    assert core.worker_count == 2
    view = core.worker("a")
    assert view is not None
    assert view.heartbeat.task_slots == 6
    assert order(core) == ["a", "b"]


# ==== int64 heartbeats ====


@pytest.mark.parametrize("last", [2**63, 2**128, -(2**63) - 1])
def test_heartbeat_outside_int64_never_reaches_the_index(last: int) -> None:
    """The index's group-skip sentinel assumes int64 heartbeats (as the Go struct has):
    decode_heartbeat rejects anything larger, so the core never sees one."""
    raw = b'{"workerAddr":"b","taskSlots":1,"lastHeartbeatMs":%d}' % last
    with pytest.raises(InvalidHeartbeat):
        decode_heartbeat(raw)


def test_heartbeat_at_int64_max_still_selectable_after_a_stale_group() -> None:
    b = decode_heartbeat(b'{"workerAddr":"b","taskSlots":1,"lastHeartbeatMs":%d}' % (2**63 - 1))
    stale_a = hb("a", slots=2, last=NOW - TIMEOUT - 1)  # ranks first, then found stale
    core = make_core(stale_a, b)
    assert pick(core) == "b"
