"""Property tests: CoordinatorCore.select_candidate equals a brute-force reference.

The core keeps routable workers in a sorted index, parks circuit-broken workers
outside it and releases them from a heap; none of that may change the answer.
The reference below is the specification's definition written as a linear scan: filters
in the specified order, then the ``candidateRanksBefore`` comparator.

A small independent model of the view (heartbeat + local fields per address,
``initialized``, the first disconnect time) is kept alongside, so bookkeeping
bugs in the core (a lost failure count, a breaker that survives a removal) are
caught too, not only ordering bugs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx_core.coordinator import (
    Candidate,
    CandidateIndex,
    CoordinatorConfig,
    CoordinatorCore,
    WorkerView,
    rank_key,
)
from blockx_core.errors import ErrorCode, Refusal
from blockx_core.heartbeat import WorkerHeartbeat

POOL = ["a", "b", "c", "d"]

CONFIGS = [
    # Short times so that staleness, grace and cooldown all happen within a few steps.
    CoordinatorConfig(
        heartbeat_timeout_ms=100,
        watch_grace_period_ms=50,
        circuit_breaker_threshold=2,
        circuit_breaker_cooldown_ms=30,
    ),
    CoordinatorConfig(
        heartbeat_timeout_ms=60,
        watch_grace_period_ms=60,
        circuit_breaker_threshold=1,
        circuit_breaker_cooldown_ms=45,
        cpu_red_line=1.0,
        memory_red_line=0.5,
        error_rate_red_line=0.2,
    ),
    CoordinatorConfig(
        heartbeat_timeout_ms=120,
        watch_grace_period_ms=10,
        circuit_breaker_threshold=3,
        circuit_breaker_cooldown_ms=1,
    ),
]

# Values on, just under and just over every red line used by CONFIGS.
FRACTIONS = sorted(
    {
        0.0,
        0.2,
        math.nextafter(0.2, 1.0),
        0.5,
        math.nextafter(0.5, 1.0),
        0.9,
        math.nextafter(0.9, 0.0),
        math.nextafter(0.9, 1.0),
        1.0,
    }
)


# ---- the reference ----


def comparator_key(view: WorkerView) -> tuple[int, int, float, str]:
    """candidateRanksBefore: more free capacity, newer heartbeat, lower penalty, address."""
    hb = view.heartbeat
    return (-hb.free_capacity, -hb.last_heartbeat_ms, view.penalty, hb.worker_addr)


def reference_select(core: CoordinatorCore, exclude: frozenset[str], now: int, ready: bool) -> str:
    """The expected answer: an address, or an error code as a string."""
    if not ready:
        return str(ErrorCode.UNAVAILABLE)
    cfg = core.config
    views = list(core.workers())
    survivors: list[WorkerView] = []
    for view in views:
        hb = view.heartbeat
        if hb.worker_addr in exclude:
            continue
        if now - hb.last_heartbeat_ms > cfg.heartbeat_timeout_ms:
            continue
        if hb.cpu_percent > cfg.cpu_red_line:
            continue
        if hb.memory_percent > cfg.memory_red_line:
            continue
        if hb.error_rate > cfg.error_rate_red_line:
            continue
        if now < view.circuit_breaker_deadline_ms:
            continue
        if hb.free_capacity <= 0:
            continue
        survivors.append(view)
    if survivors:
        best = survivors[0]
        for view in survivors[1:]:
            if comparator_key(view) < comparator_key(best):
                best = view
        return best.worker_addr
    if not views or not any(
        now - v.heartbeat.last_heartbeat_ms <= cfg.heartbeat_timeout_ms for v in views
    ):
        return str(ErrorCode.UNAVAILABLE)
    return str(ErrorCode.NO_EXECUTABLE_SLOT)


def actual_select(core: CoordinatorCore, exclude: frozenset[str], now: int) -> str:
    result = core.select_candidate("task", exclude, now)
    if isinstance(result, Candidate):
        return result.worker_addr
    assert isinstance(result, Refusal)
    return str(result.code)


# ---- an independent model of the state ----


@dataclass
class Local:
    heartbeat: WorkerHeartbeat
    failures: int = 0
    deadline: int = 0


@dataclass
class Model:
    config: CoordinatorConfig
    workers: dict[str, Local] = field(default_factory=dict)
    initialized: bool = False
    disconnected_at: int | None = None

    def ready(self, now: int) -> bool:
        if not self.initialized:
            return False
        since = self.disconnected_at
        return since is None or now - since <= self.config.watch_grace_period_ms

    def update(self, hb: WorkerHeartbeat) -> None:
        old = self.workers.get(hb.worker_addr)
        if old is None:
            self.workers[hb.worker_addr] = Local(hb)
        else:
            old.heartbeat = hb

    def full_list(self, heartbeats: Iterable[WorkerHeartbeat]) -> None:
        new: dict[str, Local] = {}
        for hb in heartbeats:
            old = self.workers.get(hb.worker_addr) or new.get(hb.worker_addr)
            new[hb.worker_addr] = (
                Local(hb) if old is None else Local(hb, old.failures, old.deadline)
            )
        self.workers = new
        self.initialized = True

    def failure(self, addr: str, now: int) -> None:
        local = self.workers.get(addr)
        if local is None:
            return
        local.failures += 1
        if local.failures >= self.config.circuit_breaker_threshold:
            local.deadline = now + self.config.circuit_breaker_cooldown_ms

    def success(self, addr: str) -> None:
        local = self.workers.get(addr)
        if local is not None:
            local.failures = 0
            local.deadline = 0

    def check_matches(self, core: CoordinatorCore) -> None:
        assert core.initialized == self.initialized
        assert core.watch_disconnected_at_ms == self.disconnected_at
        assert core.worker_count == len(self.workers)
        for addr, local in self.workers.items():
            view = core.worker(addr)
            assert view is not None, addr
            assert view.heartbeat == local.heartbeat
            assert view.recent_failure_count == local.failures
            assert view.penalty == float(local.failures)
            assert view.circuit_breaker_deadline_ms == local.deadline
        for addr in POOL:
            if addr not in self.workers:
                assert core.worker(addr) is None


# ---- operations ----


@dataclass(frozen=True)
class HbSpec:
    """A heartbeat whose lastHeartbeatMs is relative to the time of the operation."""

    addr: str
    slots: int
    reserved: int
    running: int
    cpu: float
    mem: float
    err: float
    age: int

    def at(self, now: int) -> WorkerHeartbeat:
        return WorkerHeartbeat(
            worker_addr=self.addr,
            task_slots=self.slots,
            reserved_slots=self.reserved,
            running_tasks=self.running,
            cpu_percent=self.cpu,
            memory_percent=self.mem,
            error_rate=self.err,
            last_heartbeat_ms=now - self.age,
        )


@dataclass(frozen=True)
class Op:
    kind: str
    dt: int  # time moves by dt before the operation (mostly forward)
    addr: str = "a"
    hb: HbSpec | None = None
    full: tuple[HbSpec, ...] = ()
    exclude: frozenset[str] = frozenset()


_fraction = st.sampled_from(FRACTIONS)
# Few distinct ages: heartbeat ties are frequent; the timeouts of CONFIGS sit among them.
_age = st.sampled_from([-10, 0, 0, 1, 5, 59, 60, 61, 99, 100, 101, 119, 120, 121, 200])

hb_specs = st.builds(
    HbSpec,
    addr=st.sampled_from(POOL),
    slots=st.integers(0, 5),
    reserved=st.integers(0, 6),
    running=st.integers(0, 6),
    cpu=st.one_of(st.just(0.0), _fraction),
    mem=st.one_of(st.just(0.0), _fraction),
    err=st.one_of(st.just(0.0), _fraction),
    age=_age,
)

_dt = st.one_of(st.integers(0, 40), st.integers(0, 40), st.integers(-60, 0), st.just(0))
_addr = st.sampled_from([*POOL, "zz-unknown"])

ops = st.one_of(
    st.builds(Op, kind=st.just("update"), dt=_dt, hb=hb_specs),
    st.builds(Op, kind=st.just("update"), dt=_dt, hb=hb_specs),
    st.builds(Op, kind=st.just("remove"), dt=_dt, addr=_addr),
    st.builds(
        Op,
        kind=st.just("full"),
        dt=_dt,
        full=st.lists(hb_specs, max_size=6).map(tuple),
    ),
    st.builds(
        Op,
        kind=st.sampled_from(["success", "rejection", "timeout", "backpressure"]),
        dt=_dt,
        addr=_addr,
    ),
    st.builds(
        Op,
        kind=st.sampled_from(["rejection", "timeout"]),
        dt=_dt,
        addr=st.sampled_from(POOL),
    ),
    # Enough failures at once to open the breaker.
    st.builds(Op, kind=st.just("trip"), dt=_dt, addr=st.sampled_from(POOL)),
    st.builds(Op, kind=st.sampled_from(["disconnect", "reconnect"]), dt=_dt),
    st.builds(
        Op,
        kind=st.just("select"),
        dt=_dt,
        exclude=st.frozensets(_addr, max_size=4),
    ),
)


def _apply(core: CoordinatorCore, model: Model, op: Op, now: int) -> None:
    if op.kind == "update":
        assert op.hb is not None
        hb = op.hb.at(now)
        core.apply_worker_update(hb, now)
        model.update(hb)
    elif op.kind == "remove":
        core.apply_worker_removal(op.addr, now)
        model.workers.pop(op.addr, None)
    elif op.kind == "full":
        beats = [s.at(now) for s in op.full]
        core.apply_full_worker_list(beats, now)
        model.full_list(beats)
    elif op.kind == "success":
        core.record_slot_success(op.addr, now)
        model.success(op.addr)
    elif op.kind == "rejection":
        core.record_slot_rejection(op.addr, now)
        model.failure(op.addr, now)
    elif op.kind == "timeout":
        core.record_slot_timeout(op.addr, now)
        model.failure(op.addr, now)
    elif op.kind == "trip":
        for _ in range(model.config.circuit_breaker_threshold):
            core.record_slot_rejection(op.addr, now)
            model.failure(op.addr, now)
    elif op.kind == "backpressure":
        core.record_slot_backpressure(op.addr, now)
    elif op.kind == "disconnect":
        core.mark_watch_disconnected(now)
        if model.disconnected_at is None:
            model.disconnected_at = now
    elif op.kind == "reconnect":
        core.mark_watch_reconnected(now)
        model.disconnected_at = None
    else:
        assert op.kind == "select"


def _critical_times(model: Model) -> list[int]:
    """The instants where some filter or readiness flips, and the instants before them."""
    cfg = model.config
    times: set[int] = set()
    for local in model.workers.values():
        if local.deadline:
            times.update((local.deadline - 1, local.deadline))
        stale_at = local.heartbeat.last_heartbeat_ms + cfg.heartbeat_timeout_ms
        times.update((stale_at, stale_at + 1))
    if model.disconnected_at is not None:
        lost_at = model.disconnected_at + cfg.watch_grace_period_ms
        times.update((lost_at, lost_at + 1))
    return sorted(times)


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    config=st.sampled_from(CONFIGS),
    start_full=st.booleans(),
    program=st.lists(ops, min_size=8, max_size=50),
)
def test_select_candidate_matches_reference(
    config: CoordinatorConfig, start_full: bool, program: list[Op]
) -> None:
    core = CoordinatorCore(config)
    model = Model(config)
    now = 1_000
    if start_full:
        core.apply_full_worker_list([], now)
        model.full_list([])
    for step, op in enumerate(program):
        now += op.dt
        _apply(core, model, op, now)
        model.check_matches(core)
        ready = model.ready(now)
        assert core.is_ready(now) == ready, f"step {step}: {op}"
        exclude = op.exclude if op.kind == "select" else frozenset()
        expected = reference_select(core, exclude, now, ready)
        assert actual_select(core, exclude, now) == expected, f"step {step}: {op}"
        # Probe the boundaries of every deadline in the state, and times before and after
        # now: the answer must not depend on when (or how often) select was called.
        for probe in [*_critical_times(model), now + 17, now - 23, now]:
            assert actual_select(core, frozenset(), probe) == reference_select(
                core, frozenset(), probe, model.ready(probe)
            ), f"step {step} probe {probe}: {op}"


@settings(max_examples=150, deadline=None)
@given(config=st.sampled_from(CONFIGS), program=st.lists(ops, min_size=5, max_size=40))
def test_selection_walk_matches_reference_order(
    config: CoordinatorConfig, program: list[Op]
) -> None:
    """Selecting and excluding repeatedly (ReserveWorkerSlot's loop) visits the
    survivors in exactly the comparator's order."""
    core = CoordinatorCore(config)
    model = Model(config)
    now = 1_000
    core.apply_full_worker_list([], now)
    model.full_list([])
    for op in program:
        now += op.dt
        _apply(core, model, op, now)
    tried: set[str] = set()
    for _ in range(len(POOL) + 2):
        exclude = frozenset(tried)
        expected = reference_select(core, exclude, now, model.ready(now))
        assert actual_select(core, exclude, now) == expected
        if expected not in POOL:
            break
        tried.add(expected)


# ---- CandidateIndex ----


def _view(addr: str, free: int, last: int, penalty: float) -> WorkerView:
    view = WorkerView(WorkerHeartbeat(worker_addr=addr, task_slots=free, last_heartbeat_ms=last))
    view.penalty = penalty
    return view


_index_views = st.builds(
    _view,
    addr=st.sampled_from([*POOL, "e", "f"]),
    free=st.integers(1, 4),
    last=st.integers(-3, 3),
    penalty=st.sampled_from([0.0, 1.0, 2.0]),
)
_index_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _index_views),
        st.tuples(st.just("discard"), st.sampled_from([*POOL, "e", "f", "x"])),
        st.tuples(st.just("rebuild"), st.lists(_index_views, max_size=6)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(program=_index_ops, fresh_since=st.integers(-4, 4), data=st.data())
def test_candidate_index_ranked_is_sorted_by_comparator(
    program: list[tuple[str, object]], fresh_since: int, data: st.DataObject
) -> None:
    index = CandidateIndex()
    content: dict[str, WorkerView] = {}
    for kind, arg in program:
        if kind == "put":
            assert isinstance(arg, WorkerView)
            index.put(arg)
            content[arg.worker_addr] = arg
        elif kind == "discard":
            assert isinstance(arg, str)
            index.discard(arg)
            content.pop(arg, None)
        else:
            assert isinstance(arg, list)
            unique = {v.worker_addr: v for v in arg}  # rebuild takes one view per worker
            index.rebuild(list(unique.values()))
            content = dict(unique)
        ranked = index.ranked()
        assert len(index) == len(content)
        assert sorted(ranked) == sorted(content)
        keys = [comparator_key(content[a]) for a in ranked]
        assert keys == sorted(keys)
        assert all(rank_key(content[a]) == comparator_key(content[a]) for a in ranked)
        for addr in [*POOL, "e", "f", "x"]:
            assert (addr in index) == (addr in content)
    # first() equals a linear scan of ranked() under the same filters.
    exclude = data.draw(st.frozensets(st.sampled_from([*POOL, "e", "f"])))
    blocked = data.draw(st.frozensets(st.sampled_from([*POOL, "e", "f"])))
    expected = next(
        (
            a
            for a in index.ranked()
            if content[a].heartbeat.last_heartbeat_ms >= fresh_since
            and a not in exclude
            and a not in blocked
        ),
        None,
    )
    got = index.first(fresh_since_ms=fresh_since, exclude=exclude, blocked=blocked.__contains__)
    assert got == expected
