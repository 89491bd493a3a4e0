"""EtcdWorkerWatcher against a real etcd; the tests play the Worker side with aetcd.

Tests that only need their own keys use the shared ``etcd_server`` and a
``unique_lane`` prefix. Tests that kill, compact or use the fixed legacy
prefixes start their own etcd with ``etcd_factory``. A small TCP proxy between
the watcher and etcd plays the network: ``cut`` refuses and resets connections,
``freeze`` keeps them open but silently drops every byte. Two small watcher
subclasses time what a real etcd cannot be made to do on cue: a compaction
between a list and its watch, and one prefix staying down while another recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aetcd
import aetcd.exceptions
import pytest
from support import FakeClock, TcpProxy, free_port, wait_until

from blockx_core.coordinator import (
    Candidate,
    CoordinatorConfig,
    CoordinatorCore,
    SelectResult,
)
from blockx_core.errors import ErrorCode, InvalidConfig, Refusal
from blockx_core.heartbeat import WorkerHeartbeat, encode_heartbeat
from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    RegistryFormat,
    worker_key,
)
from blockx_server.etcd.local import EtcdServer
from blockx_server.etcd.watcher import EtcdWatcherConfig, EtcdWorkerWatcher, raise_if_cancelled
from blockx_server.runtime.clock import SYSTEM_CLOCK

EtcdFactory = Callable[..., Awaitable[EtcdServer]]
NOW = 1_900_000_000_000
TIMEOUT_S = 10.0


def hb(addr: str, *, ms: int = NOW, slots: int = 4, reserved: int = 0) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_addr=addr, task_slots=slots, reserved_slots=reserved, last_heartbeat_ms=ms
    )


async def put_hb(
    client: aetcd.Client, prefix: str, heartbeat: WorkerHeartbeat, lease: object = None
) -> None:
    key = worker_key(prefix, heartbeat.worker_addr).encode()
    await client.put(key, encode_heartbeat(heartbeat), lease=lease)


def heartbeat_of(core: CoordinatorCore, addr: str) -> WorkerHeartbeat | None:
    view = core.worker(addr)
    return None if view is None else view.heartbeat


def error_code(result: SelectResult) -> ErrorCode | None:
    return result.code if isinstance(result, Refusal) else None


def addrs(core: CoordinatorCore) -> set[str]:
    return {view.worker_addr for view in core.workers()}


@contextlib.asynccontextmanager
async def etcd_client(server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    async with aetcd.Client(server.host, server.port, timeout=5) as client:
        yield client


@contextlib.asynccontextmanager
async def running(watcher: EtcdWorkerWatcher) -> AsyncIterator[EtcdWorkerWatcher]:
    """Run the watcher for the block; a crash of run() fails the test on exit."""
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher
    finally:
        crashed = task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not crashed, "EtcdWorkerWatcher.run() returned or crashed"


async def initialized(watcher: EtcdWorkerWatcher) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        await watcher.wait_initialized()


def make_watcher(
    endpoints: tuple[str, ...],
    prefixes: tuple[str, ...],
    core: CoordinatorCore | None = None,
    *,
    retry_delay_ms: int = 100,
) -> tuple[EtcdWorkerWatcher, CoordinatorCore]:
    if core is None:
        core = CoordinatorCore()
    config = EtcdWatcherConfig(
        endpoints=endpoints,
        key_prefixes=prefixes,
        dial_timeout_ms=2_000,
        retry_delay_ms=retry_delay_ms,
    )
    return EtcdWorkerWatcher(config, core, FakeClock(NOW)), core


@pytest.fixture
async def proxied_etcd(etcd_factory: EtcdFactory) -> AsyncIterator[tuple[EtcdServer, TcpProxy]]:
    # The keepalive test pings every 200 ms: etcd must allow it or it answers "too many pings".
    server = await etcd_factory(extra_args=["--grpc-keepalive-min-time=100ms"])
    proxy = TcpProxy(server.port)
    await proxy.start()
    try:
        yield server, proxy
    finally:
        await proxy.close()


# ---- configuration ---------------------------------------------------------------


def test_config_parses_endpoints_and_validates() -> None:
    prefix = "/blockx/test/lanes/default/workers/"
    config = EtcdWatcherConfig(
        endpoints=("http://10.0.0.1:2379", "https://etcd-2:2380/", "[::1]:2381", "etcd-3"),
        key_prefixes=(prefix,),
    )
    assert config.host_ports() == [
        ("10.0.0.1", 2379),
        ("etcd-2", 2380),
        ("[::1]", 2381),
        ("etcd-3", 2379),
    ]
    config.validate()
    bad_configs = [
        EtcdWatcherConfig(endpoints=(), key_prefixes=(prefix,)),
        EtcdWatcherConfig(endpoints=("host:port",), key_prefixes=(prefix,)),
        EtcdWatcherConfig(endpoints=("[::1:2379",), key_prefixes=(prefix,)),
        EtcdWatcherConfig(endpoints=("::1:2379",), key_prefixes=(prefix,)),
        EtcdWatcherConfig(key_prefixes=()),
        EtcdWatcherConfig(key_prefixes=(prefix, prefix)),
        EtcdWatcherConfig(key_prefixes=("/blockx/test/lanes/default/workers",)),
        EtcdWatcherConfig(key_prefixes=(prefix,), retry_delay_ms=0),
    ]
    for bad in bad_configs:
        with pytest.raises(InvalidConfig):
            bad.validate()


# ---- list, readiness, watch ----------------------------------------------------------


async def test_initial_list_initializes_the_core(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    async with etcd_client(etcd_server) as client:
        await put_hb(client, prefix, hb("w-free:1"))
        await put_hb(client, prefix, hb("w-full:1", slots=2, reserved=2))
    watcher, core = make_watcher((etcd_server.endpoint,), (prefix,))
    assert not core.is_ready(NOW)

    async with running(watcher):
        await initialized(watcher)
        assert core.initialized
        assert addrs(core) == {"w-free:1", "w-full:1"}
        assert core.is_ready(NOW)
        assert core.select_candidate("task-1", frozenset(), NOW) == Candidate("w-free:1")
        assert watcher.connected_prefixes() == {prefix}
        assert watcher.worker_count_by_format() == {RegistryFormat.LEGACY: 0, RegistryFormat.V2: 2}
        assert watcher.skipped_values == 0


async def test_not_initialized_until_every_prefix_listed(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    slow, fast = unique_lane(), unique_lane()
    async with etcd_client(etcd_server) as client:
        await put_hb(client, slow, hb("w-slow:1"))
        await put_hb(client, fast, hb("w-fast:1"))
    # Prefix i starts at endpoint i: ``slow`` first dials a closed port and waits a
    # whole retry delay before rotating to the live etcd, while ``fast`` lists at once.
    dead = f"http://127.0.0.1:{free_port()}"
    watcher, core = make_watcher((dead, etcd_server.endpoint), (slow, fast), retry_delay_ms=1_000)

    async with running(watcher):
        await wait_until(lambda: watcher.connected_prefixes() == {fast}, "the fast prefix listed")
        assert not watcher.initialized
        assert not core.initialized
        assert core.worker_count == 0
        assert (
            error_code(core.select_candidate("task-1", frozenset(), NOW)) is ErrorCode.UNAVAILABLE
        )
        # The fast prefix's worker waits in the merge, not in the core.
        assert watcher.worker_count_by_format()[RegistryFormat.V2] == 1

        await initialized(watcher)
        assert watcher.connected_prefixes() == {slow, fast}
        assert addrs(core) == {"w-slow:1", "w-fast:1"}
        assert core.is_ready(NOW)


async def test_watch_put_update_delete_reach_the_core(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    watcher, core = make_watcher((etcd_server.endpoint,), (prefix,))
    async with running(watcher), etcd_client(etcd_server) as client:
        await initialized(watcher)
        assert core.worker_count == 0
        # Initialized on an empty registry: ready, but no worker to route to.
        assert core.is_ready(NOW)
        assert (
            error_code(core.select_candidate("task-1", frozenset(), NOW)) is ErrorCode.UNAVAILABLE
        )

        await put_hb(client, prefix, hb("w:1", slots=4))
        await wait_until(lambda: core.worker("w:1") is not None, "the put")
        assert core.select_candidate("task-1", frozenset(), NOW) == Candidate("w:1")

        updated = hb("w:1", ms=NOW + 1, slots=4, reserved=4)
        await put_hb(client, prefix, updated)
        await wait_until(lambda: heartbeat_of(core, "w:1") == updated, "the update")
        assert error_code(core.select_candidate("task-1", frozenset(), NOW + 1)) is (
            ErrorCode.NO_EXECUTABLE_SLOT
        )

        await client.delete(worker_key(prefix, "w:1").encode())
        await wait_until(lambda: core.worker("w:1") is None, "the delete")
        assert watcher.lists_completed == 1, "changes came from the watch, not from re-lists"


async def test_lease_expiry_and_revoke_remove_workers(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    watcher, core = make_watcher((etcd_server.endpoint,), (prefix,))
    async with running(watcher), etcd_client(etcd_server) as client:
        await initialized(watcher)
        short = await client.lease(1)
        long = await client.lease(60)
        await put_hb(client, prefix, hb("w-expires:1"), lease=short)
        await put_hb(client, prefix, hb("w-revoked:1"), lease=long)
        await put_hb(client, prefix, hb("w-stays:1"))
        await wait_until(lambda: core.worker_count == 3, "three workers")

        await long.revoke()
        await wait_until(lambda: core.worker("w-revoked:1") is None, "the revoke")
        # Nobody refreshes the 1 s lease: etcd expires it and deletes the key.
        await wait_until(lambda: core.worker("w-expires:1") is None, "the lease expiry")
        assert addrs(core) == {"w-stays:1"}


async def test_legacy_and_v2_prefixes_merge_by_worker(
    etcd_factory: EtcdFactory, unique_lane: Callable[..., str]
) -> None:
    server = await etcd_factory()  # the legacy prefix is a fixed string: a private etcd
    legacy, v2 = LEGACY_BLOCK_WORKER_REGISTRY_PREFIX, unique_lane()
    async with etcd_client(server) as client:
        # Same worker, same lastHeartbeatMs under both: v2 wins the tie.
        await put_hb(client, legacy, hb("w-both:1", slots=2))
        await put_hb(client, v2, hb("w-both:1", slots=8))
        await put_hb(client, legacy, hb("w-legacy:1"))
        watcher, core = make_watcher((server.endpoint,), (legacy, v2))

        def slots() -> int | None:
            heartbeat = heartbeat_of(core, "w-both:1")
            return None if heartbeat is None else heartbeat.task_slots

        async with running(watcher):
            await initialized(watcher)
            assert addrs(core) == {"w-both:1", "w-legacy:1"}
            assert slots() == 8
            assert watcher.worker_count_by_format() == {
                RegistryFormat.LEGACY: 2,
                RegistryFormat.V2: 1,
            }

            # A newer heartbeat wins whatever its format.
            await put_hb(client, legacy, hb("w-both:1", ms=NOW + 5, slots=3))
            await wait_until(lambda: slots() == 3, "the newer legacy heartbeat")
            # An older v2 heartbeat loses; "w-v2" (later on the same watch) marks it seen.
            await put_hb(client, v2, hb("w-both:1", ms=NOW + 1, slots=9))
            await put_hb(client, v2, hb("w-v2:1"))
            await wait_until(lambda: core.worker("w-v2:1") is not None, "the v2 marker")
            assert slots() == 3

            # Gone under legacy only: the v2 entry takes over.
            await client.delete(worker_key(legacy, "w-both:1").encode())
            await wait_until(lambda: slots() == 9, "the v2 entry after the legacy delete")
            # Gone under both: gone.
            await client.delete(worker_key(v2, "w-both:1").encode())
            await wait_until(lambda: core.worker("w-both:1") is None, "the second delete")
            assert addrs(core) == {"w-legacy:1", "w-v2:1"}
            assert watcher.worker_count_by_format() == {
                RegistryFormat.LEGACY: 1,
                RegistryFormat.V2: 1,
            }


async def test_bad_values_are_skipped_and_counted(
    etcd_server: EtcdServer, unique_lane: Callable[..., str]
) -> None:
    prefix = unique_lane()
    async with etcd_client(etcd_server) as client:
        await client.put(f"{prefix}bad:1".encode(), b"not json at all")
        await put_hb(client, prefix, hb("w-1:1"))
        watcher, core = make_watcher((etcd_server.endpoint,), (prefix,))
        async with running(watcher):
            await initialized(watcher)
            assert addrs(core) == {"w-1:1"}
            assert watcher.skipped_values == 1

            # workerAddr differs from the key; a negative slot count; a JSON null.
            await client.put(f"{prefix}w-x:1".encode(), encode_heartbeat(hb("w-y:1")))
            await client.put(
                f"{prefix}w-neg:1".encode(),
                b'{"workerAddr":"w-neg:1","taskSlots":-1,"lastHeartbeatMs":1}',
            )
            await client.put(f"{prefix}w-null:1".encode(), b"null")
            await put_hb(client, prefix, hb("w-2:1"))
            await wait_until(lambda: core.worker("w-2:1") is not None, "the good value after")
            assert watcher.skipped_values == 4
            assert addrs(core) == {"w-1:1", "w-2:1"}
            # Skipping is not a failure: same connection, no re-list.
            assert watcher.connected_prefixes() == {prefix}
            assert watcher.lists_completed == 1
            assert core.watch_disconnected_at_ms is None


# ---- disconnection, reconnection, compaction --------------------------------------------


async def test_etcd_crash_and_restart(
    etcd_factory: EtcdFactory, unique_lane: Callable[..., str]
) -> None:
    server = await etcd_factory()
    p1, p2 = unique_lane(), unique_lane()
    grace = 500
    core = CoordinatorCore(CoordinatorConfig(watch_grace_period_ms=grace))
    async with etcd_client(server) as client:
        await put_hb(client, p1, hb("w-a:1"))
        await put_hb(client, p1, hb("w-b:1"))
        await put_hb(client, p2, hb("w-c:1"))
    watcher, _ = make_watcher((server.endpoint,), (p1, p2), core)

    async with running(watcher):
        await initialized(watcher)
        await server.kill()
        await wait_until(lambda: watcher.connected_prefixes() == frozenset(), "both prefixes lost")
        since = core.watch_disconnected_at_ms
        assert since is not None
        # The last view is kept and trusted for the grace period, not a moment longer.
        assert addrs(core) == {"w-a:1", "w-b:1", "w-c:1"}
        assert core.is_ready(since + grace)
        assert not core.is_ready(since + grace + 1)
        assert error_code(core.select_candidate("t", frozenset(), since + grace + 1)) is (
            ErrorCode.UNAVAILABLE
        )

        await server.restart()
        async with etcd_client(server) as client:
            await client.delete(worker_key(p1, "w-b:1").encode())
            await put_hb(client, p2, hb("w-d:1"))
        await wait_until(
            lambda: (
                core.watch_disconnected_at_ms is None and addrs(core) == {"w-a:1", "w-c:1", "w-d:1"}
            ),
            "reconnection and the new view",
        )
        assert watcher.connected_prefixes() == {p1, p2}
        assert watcher.lists_completed >= 4
        assert core.is_ready(since + grace + 1)


async def test_changes_and_compaction_during_an_outage_arrive_by_a_fresh_list(
    proxied_etcd: tuple[EtcdServer, TcpProxy], unique_lane: Callable[..., str]
) -> None:
    server, proxy = proxied_etcd
    prefix = unique_lane()
    async with etcd_client(server) as client:
        await put_hb(client, prefix, hb("w-a:1"))
        await put_hb(client, prefix, hb("w-b:1"))
        watcher, core = make_watcher((proxy.endpoint,), (prefix,))
        async with running(watcher):
            await initialized(watcher)
            await proxy.cut()
            await wait_until(lambda: core.watch_disconnected_at_ms is not None, "the disconnect")

            # The watcher cannot see these: they can only reach it through a new list,
            # and the compaction takes away the history its old watch would resume from.
            await client.delete(worker_key(prefix, "w-b:1").encode())
            await put_hb(client, prefix, hb("w-a:1", slots=7))
            await put_hb(client, prefix, hb("w-c:1"))
            last = await client.get(worker_key(prefix, "w-c:1").encode())
            await client.compact(last.mod_revision, physical=True)
            assert addrs(core) == {"w-a:1", "w-b:1"}

            await proxy.start()
            await wait_until(lambda: core.watch_disconnected_at_ms is None, "the reconnection")
            assert addrs(core) == {"w-a:1", "w-c:1"}
            assert heartbeat_of(core, "w-a:1") == hb("w-a:1", slots=7)
            assert watcher.lists_completed == 2
            assert watcher.compactions == 0

            # The new watch is live.
            await put_hb(client, prefix, hb("w-d:1"))
            await wait_until(lambda: core.worker("w-d:1") is not None, "a put after reconnecting")


async def test_silent_network_loss_is_detected_by_keepalive(
    proxied_etcd: tuple[EtcdServer, TcpProxy], unique_lane: Callable[..., str]
) -> None:
    server, proxy = proxied_etcd
    prefix = unique_lane()
    core = CoordinatorCore()
    config = EtcdWatcherConfig(
        endpoints=(proxy.endpoint,),
        key_prefixes=(prefix,),
        # No call deadline can fire within the test's wait: only keepalive can notice.
        dial_timeout_ms=60_000,
        retry_delay_ms=100,
        keepalive_time_ms=200,
        keepalive_timeout_ms=300,
    )
    watcher = EtcdWorkerWatcher(config, core, SYSTEM_CLOCK)
    async with running(watcher), etcd_client(server) as client:
        await initialized(watcher)
        await put_hb(client, prefix, hb("w-a:1"))
        await wait_until(lambda: core.worker("w-a:1") is not None, "the watch to be live")
        # Nothing to poll for: let the connection go quiet, so that the ping grpc sends
        # after receiving data (BDP probe) is answered and only keepalive remains.
        await asyncio.sleep(0.5)

        frozen_at = SYSTEM_CLOCK.now_ms()
        proxy.freeze(drop=True)  # no FIN, no RST: only an unanswered ping reveals the loss
        await wait_until(lambda: core.watch_disconnected_at_ms is not None, "keepalive failure")
        since = core.watch_disconnected_at_ms
        assert since is not None
        assert since >= frozen_at
        assert watcher.connected_prefixes() == frozenset()

        # The network comes back; connections opened into the void meanwhile are reset.
        await put_hb(client, prefix, hb("w-b:1"))
        await proxy.cut()
        proxy.thaw()
        await proxy.start()
        await wait_until(lambda: core.watch_disconnected_at_ms is None, "the reconnection")
        assert addrs(core) == {"w-a:1", "w-b:1"}


class _ListsFailFor(EtcdWorkerWatcher):
    """Lists of the prefixes in ``failing`` fail as a lost connection would, so one
    prefix can stay down while another, on the same etcd, comes back."""

    failing: frozenset[str] = frozenset()

    async def _list(self, prefix: str, client: aetcd.Client) -> tuple[int, list[WorkerHeartbeat]]:
        if prefix in self.failing:
            raise aetcd.exceptions.ConnectionFailedError("injected: this prefix stays down")
        return await super()._list(prefix, client)


async def test_connected_prefixes_keep_flowing_while_another_is_down(
    proxied_etcd: tuple[EtcdServer, TcpProxy], unique_lane: Callable[..., str]
) -> None:
    server, proxy = proxied_etcd
    down, up = unique_lane(), unique_lane()
    config = EtcdWatcherConfig(
        endpoints=(proxy.endpoint,), key_prefixes=(down, up), retry_delay_ms=50
    )
    core = CoordinatorCore()
    watcher = _ListsFailFor(config, core, FakeClock(NOW))
    async with etcd_client(server) as client:
        await put_hb(client, down, hb("w-down:1"))
        await put_hb(client, up, hb("w-up-1:1"))
        async with running(watcher):
            await initialized(watcher)
            watcher.failing = frozenset({down})
            await proxy.cut()
            await wait_until(lambda: watcher.connected_prefixes() == frozenset(), "the outage")
            await client.delete(worker_key(up, "w-up-1:1").encode())
            await put_hb(client, up, hb("w-up-2:1"))
            await proxy.start()

            # ``up`` re-lists alone: its changes reach the core, which stays marked
            # disconnected and keeps the last view of ``down``.
            await wait_until(lambda: watcher.connected_prefixes() == {up}, "up to reconnect")
            assert addrs(core) == {"w-down:1", "w-up-2:1"}
            assert core.watch_disconnected_at_ms is not None
            await put_hb(client, up, hb("w-up-3:1"))
            await wait_until(lambda: core.worker("w-up-3:1") is not None, "a watch event of up")
            assert core.watch_disconnected_at_ms is not None

            await client.delete(worker_key(down, "w-down:1").encode())
            watcher.failing = frozenset()
            await wait_until(lambda: core.watch_disconnected_at_ms is None, "down to reconnect")
            assert watcher.connected_prefixes() == {down, up}
            assert addrs(core) == {"w-up-2:1", "w-up-3:1"}


class _CompactsBetweenListAndWatch(EtcdWorkerWatcher):
    """After its first list, a worker registers and etcd compacts past the list's
    revision before the watch starts: the race a real watcher must survive."""

    writer: aetcd.Client = None
    gap_prefix = ""

    async def _list(self, prefix: str, client: aetcd.Client) -> tuple[int, list[WorkerHeartbeat]]:
        listed = await super()._list(prefix, client)
        if self.lists_completed == 1:
            await put_hb(self.writer, self.gap_prefix, hb("w-gap:1"))
            # Compacting at a revision keeps that revision: compact one past the gap put.
            bump = await self.writer.put(b"/blockx-test/bump", b"x")
            await self.writer.compact(bump.header.revision)
        return listed


async def test_compacted_watch_start_relists_at_once(
    etcd_factory: EtcdFactory, unique_lane: Callable[..., str]
) -> None:
    server = await etcd_factory()
    prefix = unique_lane()
    core = CoordinatorCore()
    config = EtcdWatcherConfig(
        endpoints=(server.endpoint,), key_prefixes=(prefix,), retry_delay_ms=60_000
    )
    async with etcd_client(server) as client:
        await put_hb(client, prefix, hb("w-a:1"))
        watcher = _CompactsBetweenListAndWatch(config, core, FakeClock(NOW))
        watcher.writer, watcher.gap_prefix = client, prefix
        async with running(watcher):
            await initialized(watcher)
            # A one-minute retry delay: only the immediate re-list can bring w-gap in time.
            await wait_until(lambda: core.worker("w-gap:1") is not None, "the re-list")
            assert watcher.compactions == 1
            assert watcher.lists_completed == 2
            assert core.watch_disconnected_at_ms is None
            await put_hb(client, prefix, hb("w-b:1"))
            await wait_until(lambda: core.worker("w-b:1") is not None, "a put on the new watch")


async def test_a_cancellation_wait_for_swallowed_is_raised_before_the_watch_is_iterated() -> None:
    """aetcd confirms a new watch through asyncio.wait_for; on Python 3.11 a cancel
    arriving with the confirmation is dropped (CPython gh-86296). A coordinator
    shut down at that moment waited on its watch forever."""
    confirmed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    reached: list[str] = []

    async def create_watch() -> None:
        await asyncio.wait_for(confirmed, 5)
        reached.append("confirmed")
        raise_if_cancelled()
        reached.append("iterating the watch")

    task = asyncio.create_task(create_watch())
    await asyncio.sleep(0)  # it waits for the confirmation
    confirmed.set_result(1)
    task.cancel()  # in the same turn: the confirmation and the cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "iterating the watch" not in reached


async def test_no_cancellation_asked_for_raises_nothing() -> None:
    raise_if_cancelled()
    assert await asyncio.create_task(asyncio.sleep(0, "ran")) == "ran"
