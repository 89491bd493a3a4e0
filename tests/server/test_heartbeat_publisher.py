"""EtcdHeartbeatPublisher and SystemMetrics against a real etcd and real processes.

Tests that only need their own key use the shared ``etcd_server`` and a
``unique_lane`` prefix; the crash and restart tests start their own etcd with
``etcd_factory``. A small TCP proxy between the publisher and etcd plays the
network: ``cut`` refuses and resets connections while etcd stays up (so a
lease really expires while the Worker cannot reach etcd), ``freeze`` holds
every byte (a slow etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aetcd
import pytest
from support import NOW_MS, FakeClock, TcpProxy, wait_until

from blockx_core.coordinator import Candidate, CoordinatorConfig, CoordinatorCore
from blockx_core.errors import InvalidConfig
from blockx_core.heartbeat import WorkerHeartbeat, decode_heartbeat, encode_heartbeat
from blockx_core.registry import LEGACY_BLOCK_WORKER_REGISTRY_PREFIX
from blockx_server.etcd.heartbeat import (
    EtcdHeartbeatPublisher,
    HeartbeatPublisherConfig,
    _lease_not_found,
)
from blockx_server.etcd.local import EtcdServer
from blockx_server.etcd.watcher import EtcdWatcherConfig, EtcdWorkerWatcher
from blockx_server.runtime.system import SystemMetrics

EtcdFactory = Callable[..., Awaitable[EtcdServer]]
ADDR = "127.0.0.1:7001"
MB = 1 << 20


class ScriptedLoad:
    """A WorkerLoad whose answers the test sets; counts how often it was asked."""

    def __init__(self, counts: tuple[int, int, int] = (8, 2, 3), error_rate: float = 0.25):
        self.counts = counts
        self.rate = error_rate
        self.calls = 0

    def heartbeat_counts(self, now_ms: int) -> tuple[int, int, int]:
        self.calls += 1
        return self.counts

    def error_rate(self, now_ms: int) -> float:
        return self.rate


@contextlib.asynccontextmanager
async def proxy_to(port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@contextlib.asynccontextmanager
async def etcd_client(server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    async with aetcd.Client(server.host, server.port, timeout=5) as client:
        yield client


def make_publisher(
    endpoint: str,
    prefix: str,
    *,
    load: ScriptedLoad | None = None,
    clock: FakeClock | None = None,
    lease_ttl_s: int = 10,
    interval_ms: int = 50,
    dial_timeout_ms: int = 2_000,
) -> EtcdHeartbeatPublisher:
    config = HeartbeatPublisherConfig(
        endpoints=(endpoint,),
        registry_prefix=prefix,
        worker_addr=ADDR,
        interval_ms=interval_ms,
        lease_ttl_s=lease_ttl_s,
        dial_timeout_ms=dial_timeout_ms,
        retry_delay_ms=100,
    )
    return EtcdHeartbeatPublisher(
        config, load if load is not None else ScriptedLoad(), clock or FakeClock()
    )


@contextlib.asynccontextmanager
async def running(publisher: EtcdHeartbeatPublisher) -> AsyncIterator[asyncio.Task[None]]:
    """Run the publisher for the block; a crash of run() fails the test on exit."""
    task = asyncio.create_task(publisher.run())
    try:
        yield task
    finally:
        crashed = task.done() and not publisher.deregistered
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not crashed, "EtcdHeartbeatPublisher.run() returned or crashed"


async def stored(client: aetcd.Client, key: str) -> tuple[WorkerHeartbeat, int] | None:
    """The heartbeat under ``key`` and the lease it is attached to, or None."""
    kv = await client.get(key.encode())
    if kv is None:
        return None
    return decode_heartbeat(bytes(kv.value)), int(kv.lease)


async def lease_alive(client: aetcd.Client, lease_id: int) -> bool:
    # LeaseTimeToLive answers TTL -1 for a lease etcd does not have.
    return int((await client.get_lease_info(lease_id, keys=False)).TTL) >= 0


# ---- configuration -------------------------------------------------------------------

BAD_CONFIGS: list[tuple[dict[str, object], str]] = [
    ({"endpoints": ()}, "endpoints"),
    ({"endpoints": ("127.0.0.1:0",)}, "endpoints"),
    ({"registry_prefix": "/blockx/workers"}, "registry_prefix"),
    ({"registry_prefix": "/elsewhere/"}, "registry_prefix"),
    ({"worker_addr": "no-port"}, "worker_addr"),
    ({"worker_addr": "host:0"}, "worker_addr"),
    ({"worker_addr": "a/b:1"}, "worker_addr"),
    ({"interval_ms": 0}, "interval_ms"),
    ({"lease_ttl_s": 0}, "lease_ttl_s"),
    ({"dial_timeout_ms": -1}, "dial_timeout_ms"),
    ({"retry_delay_ms": 0}, "retry_delay_ms"),
]


@pytest.mark.parametrize(("change", "field"), BAD_CONFIGS)
def test_invalid_config_is_refused_at_construction(change: dict[str, object], field: str) -> None:
    fields: dict[str, object] = {
        "endpoints": ("127.0.0.1:2379",),
        "registry_prefix": LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
        "worker_addr": ADDR,
        **change,
    }
    config = HeartbeatPublisherConfig(**fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match=f"^{field} "):
        EtcdHeartbeatPublisher(config, ScriptedLoad(), FakeClock())


# ---- publishing ------------------------------------------------------------------------


async def test_publishes_heartbeat_under_a_lease(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    load = ScriptedLoad(counts=(8, 2, 3), error_rate=0.25)
    clock = FakeClock()
    publisher = make_publisher(etcd_server.endpoint, prefix, load=load, clock=clock, lease_ttl_s=7)
    assert publisher.key == prefix + ADDR
    async with etcd_client(etcd_server) as client, running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        found = await stored(client, publisher.key)
        assert found is not None
        heartbeat, lease_id = found
        assert heartbeat.worker_addr == ADDR
        assert (heartbeat.task_slots, heartbeat.reserved_slots, heartbeat.running_tasks) == (
            8,
            2,
            3,
        )
        assert heartbeat.error_rate == 0.25
        assert heartbeat.last_heartbeat_ms == NOW_MS
        assert heartbeat.memory_total_bytes > 0
        assert heartbeat.process_rss_bytes > 0
        # The key hangs on the publisher's lease, granted with the configured TTL.
        assert lease_id == publisher.lease_id
        info = await client.get_lease_info(lease_id, keys=False)
        assert int(info.grantedTTL) == 7
        assert 0 < int(info.TTL) <= 7

        # New counts and a later clock show up in the following heartbeats.
        load.counts = (8, 0, 1)
        clock.advance(1_500)

        async def updated() -> bool:
            found = await stored(client, publisher.key)
            return found is not None and found[0].last_heartbeat_ms == NOW_MS + 1_500

        await wait_until(updated, "a heartbeat with the advanced clock")
        found = await stored(client, publisher.key)
        assert found is not None
        assert (found[0].reserved_slots, found[0].running_tasks) == (0, 1)
        assert publisher.last_heartbeat is not None
        assert publisher.last_heartbeat.last_heartbeat_ms == NOW_MS + 1_500
        # The lease is still the first one: refreshed, not replaced.
        assert publisher.leases_granted == 1


async def test_keepalive_holds_a_short_lease(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    publisher = make_publisher(etcd_server.endpoint, unique_lane(), lease_ttl_s=1)
    async with etcd_client(etcd_server) as client, running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        lease_id = publisher.lease_id
        assert lease_id is not None
        # The scenario is time itself: 2.5 TTLs, which a put alone would not survive.
        await asyncio.sleep(2.5)
        assert publisher.lease_id == lease_id
        assert publisher.leases_granted == 1
        assert publisher.failures == 0
        found = await stored(client, publisher.key)
        assert found is not None
        assert found[1] == lease_id


async def test_out_of_range_load_is_clamped(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    load = ScriptedLoad(counts=(4, -1, 2), error_rate=1.5)
    publisher = make_publisher(etcd_server.endpoint, unique_lane(), load=load)
    async with etcd_client(etcd_server) as client, running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        found = await stored(client, publisher.key)
        # decode_heartbeat validates every range: the value is a valid heartbeat.
        assert found is not None
        assert (found[0].reserved_slots, found[0].error_rate) == (0, 1.0)
        load.rate = float("nan")
        await wait_until(
            lambda: (
                publisher.last_heartbeat is not None and publisher.last_heartbeat.error_rate == 0.0
            ),
            "a NaN error rate published as 0",
        )


async def test_deregister_deletes_the_key_at_once_and_stops(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    publisher = make_publisher(etcd_server.endpoint, unique_lane())
    async with etcd_client(etcd_server) as client, running(publisher) as task:
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        lease_id = publisher.lease_id
        assert lease_id is not None
        await publisher.deregister()
        # No waiting: the revoke deleted the key before deregister returned.
        assert await client.get(publisher.key.encode()) is None
        assert not await lease_alive(client, lease_id)
        assert publisher.lease_id is None
        await wait_until(task.done, "run() to return after deregister")
        assert task.exception() is None
        published = publisher.published
        await publisher.deregister()  # idempotent
        await asyncio.sleep(0.2)  # several intervals: nothing may be put any more
        assert publisher.published == published
        assert await client.get(publisher.key.encode()) is None


async def test_deregister_before_run_makes_run_return(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    publisher = make_publisher(etcd_server.endpoint, unique_lane())
    await publisher.deregister()
    async with asyncio.timeout(1):
        await publisher.run()
    assert publisher.published == 0


async def test_deregister_is_harmless_when_etcd_is_unreachable(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    async with proxy_to(etcd_server.port) as proxy:
        publisher = make_publisher(proxy.endpoint, unique_lane(), lease_ttl_s=2)
        async with etcd_client(etcd_server) as client, running(publisher) as task:
            await wait_until(lambda: publisher.published > 0, "the first heartbeat")
            await proxy.cut()
            started = time.monotonic()
            await publisher.deregister()
            assert time.monotonic() - started < 2.0
            await wait_until(task.done, "run() to return after deregister")
            # The revoke never reached etcd: the key goes when the lease expires.
            await wait_until(
                lambda: _key_absent(client, publisher.key), "the lease to expire", timeout=10
            )


async def _key_absent(client: aetcd.Client, key: str) -> bool:
    return await client.get(key.encode()) is None


async def test_a_revoked_lease_is_replaced(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    publisher = make_publisher(etcd_server.endpoint, unique_lane())
    async with etcd_client(etcd_server) as client, running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        old = publisher.lease_id
        assert old is not None
        # Someone else (an operator, a bug) revokes the lease: etcd deletes the key.
        await client.revoke_lease(old)

        async def back_on_a_new_lease() -> bool:
            found = await stored(client, publisher.key)
            return found is not None and found[1] != old and found[1] == publisher.lease_id

        await wait_until(back_on_a_new_lease, "the key to come back on a new lease")
        assert publisher.leases_granted == 2


async def test_lease_expired_while_etcd_was_unreachable(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    async with proxy_to(etcd_server.port) as proxy:
        publisher = make_publisher(proxy.endpoint, unique_lane(), lease_ttl_s=1)
        async with etcd_client(etcd_server) as client, running(publisher):
            await wait_until(lambda: publisher.published > 0, "the first heartbeat")
            old = publisher.lease_id
            assert old is not None
            await proxy.cut()
            # etcd stays up and expires the lease the Worker cannot refresh.
            await wait_until(
                lambda: _key_absent(client, publisher.key), "the lease to expire", timeout=10
            )
            assert not await lease_alive(client, old)
            assert publisher.failures > 0
            await proxy.start()

            async def back() -> bool:
                found = await stored(client, publisher.key)
                return found is not None and found[1] == publisher.lease_id != old

            await wait_until(back, "the key to come back on a new lease")
            assert publisher.leases_granted == 2


async def test_slow_etcd_keeps_one_put_in_flight(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    load = ScriptedLoad()
    async with proxy_to(etcd_server.port) as proxy:
        publisher = make_publisher(
            proxy.endpoint, unique_lane(), load=load, interval_ms=50, dial_timeout_ms=5_000
        )
        async with running(publisher):
            await wait_until(lambda: publisher.published > 2, "a few heartbeats")
            proxy.freeze()
            built = load.calls
            published = publisher.published
            # etcd answers nothing for 0.6 s: 12 intervals.
            await asyncio.sleep(0.6)
            # One heartbeat built for the put that is stuck (plus at most one that was
            # being built as the freeze began); none queued behind it.
            assert load.calls - built <= 2
            proxy.thaw()
            await wait_until(lambda: publisher.published > published, "the stuck put to finish")
            assert publisher.skipped_ticks >= 8
            assert publisher.failures == 0


# ---- etcd crashes ----------------------------------------------------------------------


async def test_recovers_after_etcd_crash_and_restart(
    etcd_factory: EtcdFactory, unique_lane: Callable[..., str]
) -> None:
    etcd = await etcd_factory()
    clock = FakeClock()
    publisher = make_publisher(etcd.endpoint, unique_lane(), clock=clock)
    async with running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        await etcd.kill()
        await wait_until(lambda: publisher.failures > 0, "the publisher to notice")
        clock.advance(5_000)
        await etcd.restart()
        async with etcd_client(etcd) as client:

            async def fresh() -> bool:
                found = await stored(client, publisher.key)
                return (
                    found is not None
                    and found[0].last_heartbeat_ms == NOW_MS + 5_000
                    and found[1] == publisher.lease_id
                    and await lease_alive(client, found[1])
                )

            await wait_until(fresh, "a fresh heartbeat after the restart")


async def test_recovers_after_an_outage_longer_than_the_lease(
    etcd_factory: EtcdFactory, unique_lane: Callable[..., str]
) -> None:
    etcd = await etcd_factory()
    publisher = make_publisher(etcd.endpoint, unique_lane(), lease_ttl_s=1)
    async with running(publisher):
        await wait_until(lambda: publisher.published > 0, "the first heartbeat")
        await etcd.kill()
        # The outage itself: longer than the 1 s TTL. (etcd restarting on the same data
        # dir may extend the lease rather than expire it; either way the key must return.)
        await asyncio.sleep(1.5)
        await etcd.restart()
        published = publisher.published
        async with etcd_client(etcd) as client:

            async def back() -> bool:
                found = await stored(client, publisher.key)
                return (
                    publisher.published > published
                    and found is not None
                    and found[1] == publisher.lease_id
                    and await lease_alive(client, found[1])
                )

            await wait_until(back, "the key to come back on a live lease")


# ---- the Coordinator's view ----------------------------------------------------------


async def test_coordinator_routes_to_the_worker_until_it_deregisters(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    clock = FakeClock()
    # The heartbeat carries this host's real CPU and memory, which the rest of a test
    # run can push past the default red lines: this test is about routing, not shedding.
    core = CoordinatorCore(CoordinatorConfig(cpu_red_line=1.0, memory_red_line=1.0))
    watcher = EtcdWorkerWatcher(
        EtcdWatcherConfig(endpoints=(etcd_server.endpoint,), key_prefixes=(prefix,)), core, clock
    )
    publisher = make_publisher(etcd_server.endpoint, prefix, load=ScriptedLoad(), clock=clock)
    watch_task = asyncio.create_task(watcher.run())
    try:
        async with running(publisher):
            await wait_until(
                lambda: (
                    core.select_candidate("task-1", frozenset(), clock.now_ms()) == Candidate(ADDR)
                ),
                "the coordinator to select the worker",
            )
            view = core.worker(ADDR)
            assert view is not None
            assert view.heartbeat.free_capacity == 8 - 2 - 3
            await publisher.deregister()
            # Well inside the 10 s lease TTL: the revoke removed the key, not an expiry.
            await wait_until(
                lambda: core.worker(ADDR) is None, "the worker to leave the view", timeout=3
            )
    finally:
        watch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch_task


# ---- SystemMetrics ---------------------------------------------------------------------


def test_system_metrics_are_in_range() -> None:
    metrics = SystemMetrics()
    for _ in range(3):
        sample = metrics.sample()
        assert 0.0 <= sample.cpu_fraction <= 1.0
        assert 0.0 <= sample.memory_fraction <= 1.0
        assert 0 < sample.memory_available_bytes <= sample.memory_total_bytes
        assert sample.process_rss_bytes > 0
        # The sample fits the heartbeat: a decode validates every range.
        heartbeat = WorkerHeartbeat(
            worker_addr=ADDR,
            task_slots=1,
            cpu_percent=sample.cpu_fraction,
            memory_percent=sample.memory_fraction,
            memory_available_bytes=sample.memory_available_bytes,
            memory_total_bytes=sample.memory_total_bytes,
            process_rss_bytes=sample.process_rss_bytes,
            last_heartbeat_ms=NOW_MS,
        )
        assert decode_heartbeat(encode_heartbeat(heartbeat)) == heartbeat


_CHILD = f"""
import sys
ballast = b"x" * ({50 * MB})  # written, so resident
print("ready", flush=True)
sys.stdin.read()
"""


def test_process_rss_includes_child_processes() -> None:
    metrics = SystemMetrics()
    before = metrics.process_tree_rss_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        grown = metrics.process_tree_rss_bytes() - before
        assert grown >= 25 * MB, f"the tree RSS grew by {grown / MB:.1f} MB only"
    finally:
        child.kill()
        child.wait()


async def test_a_put_on_a_revoked_lease_is_told_apart_by_etcds_status(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    # The publisher re-grants its lease when etcd answers NOT_FOUND; it must tell that
    # answer by its status, whatever words etcd's message uses.
    async with aetcd.Client(host=etcd_server.host, port=etcd_server.port) as client:
        lease = await client.lease(ttl=30)
        await lease.revoke()
        with pytest.raises(aetcd.exceptions.ClientError) as lost:
            await client.put(unique_lane().encode() + b"/key", b"value", lease=lease.id)
        assert _lease_not_found(lost.value)
        with pytest.raises(aetcd.exceptions.ClientError) as other:
            await client.put(b"", b"value")  # an empty key: INVALID_ARGUMENT
        assert not _lease_not_found(other.value)
