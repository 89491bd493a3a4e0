"""EtcdWorkerWatcher: list+watch of the worker registry prefixes, fed to a worker view
(the Coordinator's CoordinatorCore; the proxy's allowed Worker addresses).

One loop per registry prefix lists the prefix, then watches it from the list's
revision + 1; a prefix counts as connected once that watch exists. Any failure
marks the prefix disconnected; the loop waits
``retry_delay_ms``, reconnects (to the next endpoint) and lists again, so a
reconnected prefix always starts from a fresh, complete list. A compacted watch
start re-lists at once. The prefixes are merged by workerAddr in
``RegistryMerge`` and its changes go to the core:

* The core is initialized (``apply_full_worker_list``) only once every prefix
  has completed its first list (and started its watch); until then changes only
  accumulate in the merge.
* A prefix losing its connection calls ``mark_watch_disconnected`` (the core
  keeps the first moment and stays ready for its grace period). Changes from
  the prefixes still connected keep flowing to the core one by one.
* Once every prefix has re-listed and is watching again, the core gets the full
  merged list and ``mark_watch_reconnected``.

Everything runs on one asyncio loop, the only one that touches the core: no
threads, no locks. The watcher only reads etcd.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol, assert_never

import aetcd
import aetcd.exceptions
import msgspec

from blockx_core.addr import DEFAULT_ETCD_PORT
from blockx_core.errors import InvalidConfig
from blockx_core.heartbeat import InvalidHeartbeat, WorkerHeartbeat, decode_heartbeat
from blockx_core.registry import InvalidRegistryPrefix, RegistryFormat, parse_registry_prefix
from blockx_core.registry_merge import MergeChange, RegistryMerge, WorkerRemoved, WorkerUpserted
from blockx_server.etcd.client import (
    close_quietly,
    grpc_options,
    parse_endpoint,
)
from blockx_server.etcd.security import EtcdSecurity, open_client
from blockx_server.runtime.clock import Clock

log = logging.getLogger(__name__)


class EtcdWatcherConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where and what to watch. ``endpoints`` are ``host:port``; an ``http://`` or
    ``https://`` scheme is accepted (kept as given here, stripped when dialling:
    ``security`` alone decides TLS) and a missing port means 2379."""

    endpoints: tuple[str, ...] = (f"localhost:{DEFAULT_ETCD_PORT}",)
    key_prefixes: tuple[str, ...]
    dial_timeout_ms: int = 5_000
    retry_delay_ms: int = 1_000
    # Ping the connection this often, and drop it when a ping is not answered in
    # time, so that a silent network loss (no FIN, no RST) fails the watch instead
    # of leaving it waiting forever. etcd refuses pings more frequent than its
    # --grpc-keepalive-min-time (5 s by default).
    keepalive_time_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    security: EtcdSecurity = EtcdSecurity()

    def validate(self) -> None:
        """Raise ``InvalidConfig`` naming the first field that breaks a rule."""
        if not self.endpoints:
            raise InvalidConfig("endpoints", "must name at least one etcd endpoint")
        for endpoint in self.endpoints:
            parse_endpoint(endpoint)
        self.security.validate()
        if not self.key_prefixes:
            raise InvalidConfig("key_prefixes", "must name at least one registry prefix")
        if len(set(self.key_prefixes)) != len(self.key_prefixes):
            raise InvalidConfig("key_prefixes", f"has duplicates: {self.key_prefixes}")
        for prefix in self.key_prefixes:
            try:
                parse_registry_prefix(prefix)
            except InvalidRegistryPrefix as exc:
                raise InvalidConfig("key_prefixes", str(exc)) from None
        for name in (
            "dial_timeout_ms",
            "retry_delay_ms",
            "keepalive_time_ms",
            "keepalive_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise InvalidConfig(name, f"must be > 0 (got {getattr(self, name)})")

    def host_ports(self) -> list[tuple[str, int]]:
        """The endpoints as ``(host, port)``; IPv6 hosts keep their brackets."""
        return [parse_endpoint(e) for e in self.endpoints]


class RegistryView(Protocol):
    """What the watcher keeps in step with the registry: the Coordinator's
    ``CoordinatorCore``, or the proxy's set of Worker addresses."""

    @property
    def worker_count(self) -> int: ...

    def apply_full_worker_list(
        self, heartbeats: Iterable[WorkerHeartbeat], now_ms: int
    ) -> None: ...

    def apply_worker_update(self, heartbeat: WorkerHeartbeat, now_ms: int) -> None: ...

    def apply_worker_removal(self, worker_addr: str, now_ms: int) -> None: ...

    def mark_watch_disconnected(self, now_ms: int) -> None: ...

    def mark_watch_reconnected(self, now_ms: int) -> None: ...


class _WatchEnded(Exception):
    """The watch stream finished without an error (etcd or the client cancelled it)."""


class EtcdWorkerWatcher:
    """Keeps a worker view (a ``RegistryView``) in step with etcd. See the module docstring."""

    def __init__(self, config: EtcdWatcherConfig, core: RegistryView, clock: Clock) -> None:
        config.validate()
        self._config = config
        self._core = core
        self._clock = clock
        self._endpoints = config.host_ports()
        self._grpc_options = grpc_options(config.keepalive_time_ms, config.keepalive_timeout_ms)
        self._prefixes = config.key_prefixes
        self._merge = RegistryMerge(config.key_prefixes)
        self._listed: set[str] = set()
        self._connected: set[str] = set()
        self._initialized = asyncio.Event()
        # True between a connected prefix failing and every prefix being back.
        self._disconnect_reported = False
        self._skipped_values = 0
        self._lists_completed = 0
        self._compactions = 0
        self._started = False

    # ---- inspection (metrics and tests) -----------------------------------------

    @property
    def config(self) -> EtcdWatcherConfig:
        return self._config

    @property
    def initialized(self) -> bool:
        """Every prefix has listed (and started watching) once; the core holds the view."""
        return self._initialized.is_set()

    async def wait_initialized(self) -> None:
        await self._initialized.wait()

    def connected_prefixes(self) -> frozenset[str]:
        """Prefixes that have listed on their current connection and are watching."""
        return frozenset(self._connected)

    def worker_count_by_format(self) -> dict[RegistryFormat, int]:
        """Distinct workers under prefixes of each format (the registry_workers gauge)."""
        return self._merge.worker_count_by_format()

    @property
    def skipped_values(self) -> int:
        """Registry values skipped as unparseable or not matching their key, counted
        each time a list or a watch event meets one."""
        return self._skipped_values

    @property
    def lists_completed(self) -> int:
        """Successful list calls, initial lists and re-lists together."""
        return self._lists_completed

    @property
    def compactions(self) -> int:
        """Watches that started below etcd's compacted revision and forced a re-list."""
        return self._compactions

    # ---- the loops ---------------------------------------------------------------

    async def run(self) -> None:
        """List and watch every prefix until cancelled."""
        if self._started:
            raise RuntimeError("EtcdWorkerWatcher.run() may only be called once")
        self._started = True
        async with asyncio.TaskGroup() as tasks:
            for index, prefix in enumerate(self._prefixes):
                # Starting each prefix at a different endpoint spreads the load.
                tasks.create_task(self._prefix_loop(prefix, index), name=f"etcd-watch {prefix}")

    async def _prefix_loop(self, prefix: str, first_endpoint: int) -> None:
        attempt = first_endpoint
        delay_s = self._config.retry_delay_ms / 1000
        while True:
            host, port = self._endpoints[attempt % len(self._endpoints)]
            attempt += 1
            # A client per attempt: the next attempt goes to the next endpoint, and no
            # state of a broken channel survives into the next one.
            client = open_client(
                host,
                port,
                timeout_s=self._config.dial_timeout_ms / 1000,
                options=self._grpc_options,
                security=self._config.security,
            )
            try:
                await self._list_and_watch(prefix, client)
            except Exception as exc:
                self._on_failure(prefix, f"{host}:{port}", exc)
            finally:
                await close_quietly(client)
            await asyncio.sleep(delay_s)

    async def _list_and_watch(self, prefix: str, client: aetcd.Client) -> None:
        """Return only by raising: a failure, or ``_WatchEnded``."""
        while True:
            revision, heartbeats = await self._list(prefix, client)
            try:
                watch = await client.watch_prefix(prefix.encode(), start_revision=revision + 1)
                raise_if_cancelled()
                # Connected only once the watch exists: a list alone goes stale. Events
                # after the list's revision wait in the watch until we iterate it.
                self._on_listed(prefix, heartbeats)
                log.info(
                    "etcd list+watch of %s at revision %d: %d workers",
                    prefix,
                    revision,
                    len(heartbeats),
                )
                async for event in watch:
                    self._on_event(prefix, event)
            except aetcd.exceptions.RevisionCompactedError as exc:
                self._compactions += 1
                log.warning(
                    "etcd watch of %s from revision %d: compacted below %s; listing again",
                    prefix,
                    revision + 1,
                    exc.compacted_revision,
                )
                continue
            raise _WatchEnded("the watch stream ended")

    async def _list(self, prefix: str, client: aetcd.Client) -> tuple[int, list[WorkerHeartbeat]]:
        """The list's revision and the valid heartbeats under ``prefix``."""
        response = await client.get_prefix(prefix.encode())
        revision = int(response.header.revision)
        heartbeats: list[WorkerHeartbeat] = []
        for kv in response:
            heartbeat = self._decode(prefix, bytes(kv.key), bytes(kv.value))
            if heartbeat is not None:
                heartbeats.append(heartbeat)
        self._lists_completed += 1
        return revision, heartbeats

    # ---- state changes (synchronous: nothing interleaves inside one) -------------

    def _on_listed(self, prefix: str, heartbeats: list[WorkerHeartbeat]) -> None:
        changes = self._merge.replace_prefix(prefix, heartbeats)
        self._listed.add(prefix)
        self._connected.add(prefix)
        now_ms = self._clock.now_ms()
        all_connected = len(self._connected) == len(self._prefixes)
        first_view = not self._initialized.is_set() and len(self._listed) == len(self._prefixes)
        if all_connected or first_view:
            # A prefix that listed before another failed keeps its last view here;
            # the disconnection mark it left makes the core count its grace period.
            self._core.apply_full_worker_list(self._merge.merged(), now_ms)
            if all_connected and self._disconnect_reported:
                self._core.mark_watch_reconnected(now_ms)
                self._disconnect_reported = False
                log.info("etcd watch: every registry prefix is connected again")
            if first_view:
                self._initialized.set()
                log.info(
                    "worker view initialized from %d prefixes: %d workers",
                    len(self._prefixes),
                    self._core.worker_count,
                )
        elif self._initialized.is_set():
            self._apply(changes, now_ms)

    def _on_event(self, prefix: str, event: Any) -> None:
        key = bytes(event.kv.key)
        worker_addr = key.decode("utf-8", errors="replace")[len(prefix) :]
        change: MergeChange | None
        if event.kind == "DELETE":
            change = self._merge.delete(prefix, worker_addr)
        else:
            heartbeat = self._decode(prefix, key, bytes(event.kv.value))
            if heartbeat is None:
                return
            change = self._merge.put(prefix, heartbeat)
        if change is not None and self._initialized.is_set():
            self._apply([change], self._clock.now_ms())

    def _on_failure(self, prefix: str, endpoint: str, exc: Exception) -> None:
        delay_ms = self._config.retry_delay_ms
        expected = (aetcd.exceptions.ClientError, _WatchEnded, OSError, TimeoutError)
        if isinstance(exc, expected):
            reason = " ".join(str(exc).split()) or "no detail"
            log.warning(
                "etcd list+watch of %s via %s failed: %s: %s; retrying in %d ms",
                prefix,
                endpoint,
                type(exc).__name__,
                reason,
                delay_ms,
            )
        else:
            # A bug rather than a network fault: keep the traceback, keep watching.
            log.error(
                "etcd list+watch of %s via %s crashed; retrying in %d ms",
                prefix,
                endpoint,
                delay_ms,
                exc_info=exc,
            )
        if prefix in self._connected:
            self._connected.discard(prefix)
            self._core.mark_watch_disconnected(self._clock.now_ms())
            self._disconnect_reported = True

    def _apply(self, changes: Iterable[MergeChange], now_ms: int) -> None:
        for change in changes:
            match change:
                case WorkerUpserted(heartbeat=heartbeat):
                    self._core.apply_worker_update(heartbeat, now_ms)
                case WorkerRemoved(worker_addr=worker_addr):
                    self._core.apply_worker_removal(worker_addr, now_ms)
                case _:
                    assert_never(change)

    def _decode(self, prefix: str, key: bytes, value: bytes) -> WorkerHeartbeat | None:
        """The heartbeat under ``key``, or None (logged and counted) if it is not one."""
        key_text = key.decode("utf-8", errors="replace")
        try:
            heartbeat = decode_heartbeat(value)
        except InvalidHeartbeat as exc:
            self._skipped_values += 1
            log.warning("skipping registry key %s: not a worker heartbeat: %s", key_text, exc)
            return None
        expected_addr = key_text[len(prefix) :]
        if heartbeat.worker_addr != expected_addr:
            self._skipped_values += 1
            log.warning(
                "skipping registry key %s: its workerAddr %r differs from the key's %r",
                key_text,
                heartbeat.worker_addr,
                expected_addr,
            )
            return None
        return heartbeat


def raise_if_cancelled() -> None:
    """Raise the current task's cancellation when one was asked for and swallowed.

    aetcd creates a watch through ``asyncio.wait_for``, which on Python 3.11 returns
    the result and drops a cancellation that arrives as the watch is confirmed
    (CPython gh-86296): the task would go on to iterate the watch with its
    cancellation lost, and a shutdown waiting for it would wait forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
