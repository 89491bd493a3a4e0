"""WorkerCore benchmark: the cost of each operation as TASK_SLOTS grows.

Run: uv run python bench/worker_core_bench.py [--slots 50,1000,100000,1000000]

For each size a WorkerCore holds the same activity (``--reserved`` ALLOCATED slots
and ``--running`` RUNNING tasks, deadlines in the future), so only the capacity
changes. Measured per operation: ``tick_timers`` with nothing due,
``next_deadline_ms``, ``derive_heartbeat`` and ``handle_request_task_slot`` of a
new task (the reservations are expired between rounds, untimed), plus building
the core once.

Baseline, measured in the same run: the scans the previous WorkerCore did on the
same call, reproduced over a list of TASK_SLOTS slot objects in the same states
(walk every slot for expired leases, the minimum lease of ALLOCATED slots, two
counting passes for the heartbeat, one object per slot at start-up). It is the
walking part alone, without the rest of that implementation's work, so it
understates the old cost a little. Absolute figures depend on the machine (a
shared 2-core box here); compare the columns, and the rows of one column.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

from blockx_core.errors import Refusal
from blockx_core.task import PluginConfig, TaskInput
from blockx_core.worker import PrepareTaskActivation, SlotState, WorkerConfig, WorkerCore

FAR_MS = 10**12  # leases and deadlines that never come due during the benchmark
NOW_MS = 1_000


def _per_op_ns(op: Callable[[], object], *, min_seconds: float = 0.05) -> float:
    """Nanoseconds per call: repeat until ``min_seconds`` passed, best of three."""
    best = float("inf")
    for _ in range(3):
        count = 0
        start = time.perf_counter_ns()
        deadline = start + int(min_seconds * 1e9)
        while True:
            op()
            count += 1
            now = time.perf_counter_ns()
            if now >= deadline:
                break
        best = min(best, (now - start) / count)
    return best


def _loaded_core(slots: int, reserved: int, running: int) -> WorkerCore:
    core = WorkerCore(
        WorkerConfig(task_slots=slots, max_task_timeout_ms=FAR_MS, task_deadline_ms=FAR_MS),
        incarnation="bench",
    )
    core.set_ready(True)
    for i in range(reserved):
        core.handle_request_task_slot(f"reserved-{i}", FAR_MS, NOW_MS)
    for i in range(running):
        task = TaskInput(
            task_id=f"running-{i}",
            function_call_config=PluginConfig(type="CallListCallConfig", config="{}"),
        )
        answer = core.handle_submit_task(task, "", NOW_MS)
        assert not isinstance(answer, Refusal), answer
        [prepare] = answer[1]
        assert isinstance(prepare, PrepareTaskActivation)
        core.handle_task_activation_prepared(task.task_id, prepare.token, NOW_MS)
    return core


def _request_slot_ns(core: WorkerCore, free: int) -> float:
    """handle_request_task_slot of new task ids; batches expire untimed in between."""
    batch = max(1, min(100, free))
    elapsed = 0
    count = 0
    now = NOW_MS
    serial = 0
    while elapsed < 50_000_000:
        start = time.perf_counter_ns()
        for _ in range(batch):
            serial += 1
            core.handle_request_task_slot(f"new-{serial}", 1, now)
        elapsed += time.perf_counter_ns() - start
        count += batch
        now += 1
        core.tick_timers(now)  # their 1 ms leases end: the slots are free again
    return elapsed / count


class _OldSlot:
    __slots__ = ("lease_deadline_ms", "state")

    def __init__(self) -> None:
        self.state = SlotState.FREE
        self.lease_deadline_ms = 0


def _scan_model(slots: int, reserved: int, running: int) -> list[_OldSlot]:
    table = [_OldSlot() for _ in range(slots)]
    for slot in table[:reserved]:
        slot.state = SlotState.ALLOCATED
        slot.lease_deadline_ms = FAR_MS
    for slot in table[reserved : reserved + running]:
        slot.state = SlotState.RUNNING
    return table


def _scan_tick(table: list[_OldSlot]) -> None:
    for slot in table:
        if slot.state is SlotState.ALLOCATED and slot.lease_deadline_ms <= NOW_MS:
            raise AssertionError("nothing is due in the benchmark")


def _scan_deadline(table: list[_OldSlot]) -> int | None:
    leases = [s.lease_deadline_ms for s in table if s.state is SlotState.ALLOCATED]
    return min(leases) if leases else None


def _scan_heartbeat(table: list[_OldSlot]) -> tuple[int, int, int]:
    reserved = sum(1 for s in table if s.state is SlotState.ALLOCATED)
    running = sum(1 for s in table if s.state is SlotState.RUNNING)
    return len(table), reserved, running


def _fmt(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="50,1000,100000,1000000")
    parser.add_argument("--reserved", type=int, default=20)
    parser.add_argument("--running", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(s) for s in args.slots.split(",")]
    reserved, running = args.reserved, args.running
    header = f"{'TASK_SLOTS':>10}  {'operation':<22}{'WorkerCore':>12}{'full scan':>12}"
    print(f"activity: {reserved} ALLOCATED + {running} RUNNING slots; per-operation cost")
    print(header)
    print("-" * len(header))
    for slots in sizes:
        if slots < reserved + running + 1:
            raise SystemExit(f"--slots {slots} cannot hold the activity plus one free slot")
        start = time.perf_counter_ns()
        core = _loaded_core(slots, reserved, running)
        build_ns = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        table = _scan_model(slots, reserved, running)
        scan_build_ns = time.perf_counter_ns() - start
        # A full scan of a million slots takes tens of ms: fewer rounds are enough.
        scan_seconds = 0.05 if slots <= 100_000 else 0.2
        rows = [
            ("start-up (+activity)", build_ns, scan_build_ns),
            (
                "tick_timers",
                _per_op_ns(functools.partial(core.tick_timers, NOW_MS)),
                _per_op_ns(functools.partial(_scan_tick, table), min_seconds=scan_seconds),
            ),
            (
                "next_deadline_ms",
                _per_op_ns(core.next_deadline_ms),
                _per_op_ns(functools.partial(_scan_deadline, table), min_seconds=scan_seconds),
            ),
            (
                "derive_heartbeat",
                _per_op_ns(core.derive_heartbeat),
                _per_op_ns(functools.partial(_scan_heartbeat, table), min_seconds=scan_seconds),
            ),
            ("request_task_slot", _request_slot_ns(core, slots - reserved - running), None),
        ]
        for name, ours, scan in rows:
            scan_text = "-" if scan is None else _fmt(scan)
            print(f"{slots:>10}  {name:<22}{_fmt(ours):>12}{scan_text:>12}")
    print(
        "full scan: the walk over every slot the previous WorkerCore did for that call "
        "(request_task_slot did not walk: popping a free list was O(1) there too); "
        "start-up: WorkerCore plus its activity vs one object per slot, without activity"
    )


if __name__ == "__main__":
    main()
