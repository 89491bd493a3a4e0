"""One fault under a steady load, then every invariant checked into a ``FaultRow``.

Two clients (one per coordinator) run tasks with ``run_many``; once the first
results are in, the fault is injected and healed while the load goes on. Each
task is two calls of ``mark``, written by ``TableUpsertsResultHandler`` into the
worker's SQLite sink keyed by a nonce that is new on every run, so the sink holds
one row per call per commit. Then:

* known: every submitted task has exactly one ``TaskResult`` (WORKER_LOST counts);
* one commit: no (task_id, call) row twice in the sinks, no result twice at the
  client, and each succeeded task's rows are there;
* slots freed: once the load is over, no worker keeps a slot ALLOCATED past its
  TTL (read from its metrics);
* retained: every succeeded task's result still answers GetTaskResult on its
  worker, unless the fault killed that worker;
* routes again: with the fault healed, both coordinators see every worker and
  place a fresh task.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from support import wait_until

from blockx_client import (
    BlockxError,
    Client,
    PluginConfig,
    RetryPolicy,
    Task,
    TaskResult,
    TaskState,
)
from faults.cluster import COORDINATORS, SINK_TABLE, SLOT_TTL_MS, WORKERS, FaultCluster, kill_9
from faults.report import FaultRow

CALLS: Final = 2
CALL_MS: Final = 150
TASKS_PER_CLIENT: Final = 24
CONCURRENCY: Final = 6
INJECT_AFTER: Final = 10  # results in before the fault
OUTCOMES_TIMEOUT_S: Final = 120
# The clients' HTTP/2 ping interval and timeout: a cut link is noticed in ~2 s.
KEEPALIVE_S: Final = 1.0
POLICY: Final = RetryPolicy(
    worker_unreachable_s=2.0, slot_ttl_s=SLOT_TTL_MS / 1000, unreachable_s=30.0
)


@dataclass(frozen=True)
class Fault:
    """``inject`` breaks something and heals it (noting what it saw in the row; the
    event is set once the load has every outcome or gave up waiting); it returns
    the workers it killed (whose retained results are gone by design)."""

    name: str
    inject: Callable[[FaultCluster, FaultRow, asyncio.Event], Awaitable[frozenset[str]]]
    # How long the load (fault included) may take to get every outcome.
    outcomes_timeout_s: float = OUTCOMES_TIMEOUT_S


def marking_task(task_id: str) -> Task:
    return Task(
        task_id=task_id,
        function_call_config=PluginConfig(
            type="CallListCallConfig",
            config={"function": "mark", "callList": [[task_id, i, CALL_MS] for i in range(CALLS)]},
        ),
        result_handler=PluginConfig(
            type="TableUpsertsResultHandler", config={"table": SINK_TABLE, "key": "nonce"}
        ),
    )


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


async def exercise(cluster: FaultCluster, fault: Fault, row: FaultRow) -> None:
    await cluster.ready()
    tag = f"{cluster.kind}-{_slug(fault.name)}"
    batches = {
        name: [marking_task(f"{tag}-{name}-{i}") for i in range(TASKS_PER_CLIENT)]
        for name in COORDINATORS
    }
    submitted = {t.task_id for tasks in batches.values() for t in tasks}
    row.tasks = len(submitted)
    results: list[TaskResult] = []
    clients = {
        name: Client(
            coordinator=cluster.coordinator_addr(name),
            retry=POLICY,
            rpc_timeout_s=3.0,
            keepalive_s=KEEPALIVE_S,
        )
        for name in COORDINATORS
    }
    try:

        async def load(name: str) -> None:
            async for result in clients[name].run_many(batches[name], concurrency=CONCURRENCY):
                results.append(result)

        async def chaos() -> frozenset[str]:
            await wait_until(lambda: len(results) >= INJECT_AFTER, "the first results", timeout=60)
            return await fault.inject(cluster, row, load_done)

        load_done = asyncio.Event()
        injected = asyncio.create_task(chaos())
        timed_out: float | None = None
        try:
            async with asyncio.timeout(fault.outcomes_timeout_s):
                await asyncio.gather(*(load(name) for name in COORDINATORS))
        except TimeoutError:
            timed_out = fault.outcomes_timeout_s
        load_done.set()
        killed = await injected  # healed before anything is checked
        check_known(row, submitted, results, timed_out)
        note_outcomes(cluster, row, results)
        await check_slots(cluster, row)
        check_commits(cluster, row, submitted, results)
        await check_retained(cluster, clients[COORDINATORS[0]], row, results, killed)
        await check_routing(cluster, clients, row, tag)
    finally:
        for client in clients.values():
            await client.close()


def check_known(
    row: FaultRow, submitted: set[str], results: list[TaskResult], timed_out: float | None
) -> None:
    answered = {r.task_id for r in results}
    missing = sorted(submitted - answered)
    row.lost = len(missing)
    stray = sorted(answered - submitted)
    why = f"no outcome for {missing[:5]} ({len(missing)})"
    if timed_out is not None:
        why += f" within {timed_out:.0f} s of the load's start"
    row.check("known", not missing and not stray, f"{why}; stray {stray[:5]}")


def note_outcomes(cluster: FaultCluster, row: FaultRow, results: list[TaskResult]) -> None:
    names = {addr: name for name, addr in cluster.worker_addrs.items()}
    where = Counter(names.get(r.worker_addr, r.worker_addr or "unplaced") for r in results)
    outcomes = Counter(r.failure_code or r.state.name for r in results)
    row.notes.append(
        "outcomes: "
        + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items()))
        + "; on "
        + ", ".join(f"{w} {n}" for w, n in sorted(where.items()))
    )


def check_commits(
    cluster: FaultCluster, row: FaultRow, submitted: set[str], results: list[TaskResult]
) -> None:
    twice_at_client = {t for t, n in Counter(r.task_id for r in results).items() if n > 1}
    rows = [(task_id, idx) for task_id, idx, _ in cluster.sink_rows() if task_id in submitted]
    per_call = Counter(rows)
    twice_in_sink = {task_id for (task_id, _), n in per_call.items() if n > 1}
    per_task = Counter(task_id for task_id, _ in rows)
    unwritten = sorted(r.task_id for r in results if r.ok and per_task[r.task_id] != CALLS)
    doubled = twice_at_client | twice_in_sink
    row.doubled = len(doubled)
    row.check(
        "one commit",
        not doubled and not unwritten,
        f"doubled {sorted(doubled)[:5]} (client {len(twice_at_client)}, sink "
        f"{len(twice_in_sink)}); succeeded without {CALLS} rows: {unwritten[:5]}",
    )


async def check_slots(cluster: FaultCluster, row: FaultRow) -> None:
    """No slot ALLOCATED once the load is over and every lease has run out: a lease
    granted just before the end, or delivered late by a healed link, ends within
    one TTL; twice that plus a margin bounds what the fault could have left."""
    seen: dict[str, int | None] = {}

    def all_free() -> bool:
        for name, worker in cluster.workers.items():
            seen[name] = cluster.allocated_slots(name) if worker.alive() else 0
        return all(count == 0 for count in seen.values())

    try:
        await wait_until(all_free, "free slots", timeout=2 * SLOT_TTL_MS / 1000 + 5, interval=0.2)
    except AssertionError:
        row.check("slots freed", False, f"ALLOCATED slots per worker past the TTL: {seen}")
        return
    row.check("slots freed", True, "")


async def check_retained(
    cluster: FaultCluster,
    client: Client,
    row: FaultRow,
    results: list[TaskResult],
    killed: frozenset[str],
) -> None:
    by_addr = {addr: name for name, addr in cluster.worker_addrs.items()}
    gone: list[str] = []
    for result in results:
        if not result.ok or by_addr.get(result.worker_addr) in killed:
            continue
        try:
            again = await client.get_task_result(result.task_id, worker_addr=result.worker_addr)
        except BlockxError as exc:
            gone.append(f"{result.task_id}: {type(exc).__name__}")
            continue
        if again.state is not TaskState.SUCCEEDED:
            gone.append(f"{result.task_id}: {again.state.name}")
    row.check("retained", not gone, f"results no longer answered: {gone[:5]} ({len(gone)})")


async def check_routing(
    cluster: FaultCluster, clients: dict[str, Client], row: FaultRow, tag: str
) -> None:
    try:
        await cluster.ready(timeout=30)
    except AssertionError as exc:
        seen = {name: cluster.workers_seen(name) for name in COORDINATORS}
        row.check("routes again", False, f"{exc}; workers seen: {seen}")
        return
    failed: list[str] = []
    for name, client in clients.items():
        task = marking_task(f"{tag}-fresh-{name}")
        try:
            result = await client.run(task, deadline_s=30)
        except BlockxError as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not result.ok:
            failed.append(f"{name}: {result.failure_code} {result.failure_message}")
    row.check("routes again", not failed, f"fresh tasks not placed: {failed}")


# ---- the faults ------------------------------------------------------------------


async def kill_executor(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """kill -9 one executor of w1; the worker starts another."""
    before = cluster.executor_pids("w1")
    assert before, "w1 has no executor processes"
    kill_9(before[:1])

    def replaced() -> bool:
        now = cluster.executor_pids("w1")
        return len(now) == len(before) and before[0] not in now

    await wait_until(replaced, "w1 replacing its killed executor", timeout=30, interval=0.1)
    return frozenset()


async def kill_worker(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """kill -9 w2 and start it again on its address (it has forgotten its tasks)."""
    cluster.workers["w2"].kill()
    await asyncio.sleep(0.5)
    await cluster.start_worker("w2").wait_ready()
    return frozenset({"w2"})


async def kill_coordinator(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """kill -9 c1 and start it again on its address after a second."""
    cluster.coordinators["c1"].kill()
    await asyncio.sleep(1.0)
    await cluster.start_coordinator("c1").wait_serving()
    return frozenset()


async def kill_etcd(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """kill -9 etcd for longer than the coordinators' watch grace, then restart it
    on its data: the leases and registrations come back."""
    cluster.etcd.kill()
    await asyncio.sleep(3.0)
    await cluster.etcd.start()
    return frozenset()


async def partition_worker(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """Cut w3 from etcd, the coordinators and the clients for longer than its lease
    and the clients' patience, then heal the link."""
    cluster.topology.cut("w3")
    try:
        await asyncio.sleep(3.5)
        # The cut is real once its lease ran out and both coordinators dropped it.
        await wait_until(
            lambda: all(cluster.workers_seen(c) == len(WORKERS) - 1 for c in COORDINATORS),
            "both coordinators dropping the cut worker",
            timeout=20,
            interval=0.1,
        )
    finally:
        cluster.topology.heal("w3")
    return frozenset()


async def restart_etcd_compacted(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """kill -9 etcd, bring it up where nobody can reach it, write past the revision
    the watchers saw and compact it away, then serve everyone again: every watcher
    resumes against a compacted history and lists again."""
    cluster.etcd.kill()
    await cluster.etcd.start(private=True)
    for i in range(5):
        await cluster.etcd.ctl(True, "put", f"/faults/filler/{i}", "x")
    status = json.loads(await cluster.etcd.ctl(True, "endpoint", "status", "-w", "json"))
    revision = int(status[0]["Status"]["header"]["revision"])
    compacted = await cluster.etcd.ctl(True, "compact", str(revision), "--physical")
    assert f"compacted revision {revision}" in compacted, compacted
    cluster.etcd.stop()
    before = cluster.compacted_watches()
    await cluster.etcd.start()
    await cluster.ready()
    met = cluster.compacted_watches() - before
    row.notes.append(
        f"compacted to revision {revision}; watches that met the compaction: {met} "
        "(a reconnecting watcher lists first and watches from that list's revision)"
    )
    return frozenset()


async def partition_worker_for_good(
    cluster: FaultCluster, row: FaultRow, load_done: asyncio.Event
) -> frozenset[str]:
    """Cut w3 and keep it cut until the clients have an outcome for every task (or
    gave up waiting): the tasks it held must become WORKER_LOST, since nothing
    comes back from a worker that went silent."""
    cluster.topology.cut("w3")
    try:
        await load_done.wait()
    finally:
        cluster.topology.heal("w3")
    return frozenset()


FAULTS: Final = (
    Fault("kill -9 an executor", kill_executor),
    Fault("kill -9 a worker", kill_worker),
    Fault("kill -9 a coordinator", kill_coordinator),
    Fault("kill -9 etcd", kill_etcd),
    Fault("partition a worker", partition_worker),
    Fault("etcd restart + compaction", restart_etcd_compacted),
    # A silent Watch stream is dropped after two keepalive periods (2 s), then the
    # clients give up on the worker after RetryPolicy.worker_unreachable_s (2 s):
    # 15 s is ample for every outcome.
    Fault(
        "partition a worker, unhealed",
        partition_worker_for_good,
        outcomes_timeout_s=15,
    ),
)

__all__ = ["FAULTS", "WORKERS", "Fault", "exercise"]
