"""EtcdHeartbeatPublisher: the Worker's entry in the registry the Coordinators watch.

The Worker owns one etcd lease and keeps ``registry prefix + workerAddr`` set to
its ``WorkerHeartbeat`` JSON, attached to that lease. While etcd is reachable
two loops share one connection:

* the heartbeat loop puts a fresh heartbeat every ``interval_ms``, one put in
  flight at a time; ticks missed while a put was slow are skipped, not queued;
* the keepalive loop refreshes the lease every third of its TTL (aetcd has no
  keepalive loop of its own).

Any failure logs one line, closes the connection, waits ``retry_delay_ms`` and
reconnects to the next endpoint. A reconnection first refreshes the old lease:
if it is gone (expired while etcd was out of reach, or revoked), a new lease is
granted and the heartbeat put again at once, so the key comes back. A lease
that disappears while connected (a put answers "lease not found", a refresh
answers TTL 0) is replaced the same way without waiting.

``deregister()`` stops publishing and revokes the lease, which deletes the key
at once (Coordinators stop routing to a draining Worker without waiting for the
TTL). Every put carries the lease, so a put still in flight cannot bring the key
back after the revoke.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Final, Protocol

import aetcd
import aetcd.exceptions
import aetcd.rpc
import msgspec

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_core.errors import InvalidConfig
from blockx_core.heartbeat import WorkerHeartbeat, encode_heartbeat
from blockx_core.registry import InvalidRegistryPrefix, parse_registry_prefix, worker_key
from blockx_server.etcd.client import close_quietly, grpc_options, parse_endpoint
from blockx_server.etcd.security import EtcdSecurity, open_client
from blockx_server.runtime.clock import Clock
from blockx_server.runtime.system import SystemMetrics, fraction, non_negative

log = logging.getLogger(__name__)

# The connection is busy with a put every interval, so a dead peer normally shows up
# as a failed put; pings cover the case where every call is stuck on a silent link.
_KEEPALIVE_TIME_MS: Final = 10_000
_KEEPALIVE_TIMEOUT_MS: Final = 5_000
# Failures of etcd or the network, as opposed to bugs (logged with a traceback).
_NETWORK_ERRORS: Final = (aetcd.exceptions.ClientError, OSError, TimeoutError)


class WorkerLoad(Protocol):
    """What the Worker's core reports for its heartbeat."""

    def heartbeat_counts(self, now_ms: int) -> tuple[int, int, int]:
        """``(task_slots, reserved_slots, running_tasks)`` from the slot table."""
        ...

    def error_rate(self, now_ms: int) -> float:
        """Failed / finished tasks over the recent window, in [0, 1]."""
        ...


class HeartbeatPublisherConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how often to publish. ``endpoints`` are etcd ``host:port`` (an
    ``http://`` scheme is accepted, a missing port means 2379); ``worker_addr`` is
    the advertised ``host:port`` Coordinators and Clients dial. ``dial_timeout_ms``
    bounds every etcd call; ``security`` holds TLS and credentials."""

    endpoints: tuple[str, ...]
    registry_prefix: str
    worker_addr: str
    interval_ms: int = 200
    lease_ttl_s: int = 10
    dial_timeout_ms: int = 5_000
    retry_delay_ms: int = 1_000
    security: EtcdSecurity = EtcdSecurity()

    def validate(self) -> None:
        """Raise ``InvalidConfig`` naming the first field that breaks a rule."""
        if not self.endpoints:
            raise InvalidConfig("endpoints", "must name at least one etcd endpoint")
        for endpoint in self.endpoints:
            parse_endpoint(endpoint)
        self.security.validate()
        try:
            parse_registry_prefix(self.registry_prefix)
        except InvalidRegistryPrefix as exc:
            raise InvalidConfig("registry_prefix", str(exc)) from None
        try:
            _, port = split_host_port(self.worker_addr)
        except InvalidAddress as exc:
            raise InvalidConfig("worker_addr", str(exc)) from None
        if port == 0:
            raise InvalidConfig("worker_addr", f"{self.worker_addr!r} has port 0")
        if "/" in self.worker_addr:
            raise InvalidConfig("worker_addr", f"{self.worker_addr!r} contains '/'")
        for name in ("interval_ms", "lease_ttl_s", "dial_timeout_ms", "retry_delay_ms"):
            if getattr(self, name) <= 0:
                raise InvalidConfig(name, f"must be > 0 (got {getattr(self, name)})")


class _LeaseLost(Exception):
    """etcd no longer has our lease (it expired or was revoked)."""


class EtcdHeartbeatPublisher:
    """Publishes the Worker's heartbeat under its lease. See the module docstring."""

    def __init__(
        self,
        config: HeartbeatPublisherConfig,
        load: WorkerLoad,
        clock: Clock,
        metrics: SystemMetrics | None = None,
    ) -> None:
        config.validate()
        self._config = config
        self._load = load
        self._clock = clock
        self._metrics = metrics if metrics is not None else SystemMetrics()
        self._endpoints = [parse_endpoint(e) for e in config.endpoints]
        self._grpc_options = grpc_options(_KEEPALIVE_TIME_MS, _KEEPALIVE_TIMEOUT_MS)
        self._key = worker_key(config.registry_prefix, config.worker_addr).encode()
        self._rpc_timeout_s = config.dial_timeout_ms / 1000
        self._next_endpoint = 0
        self._lease_id: int | None = None
        self._lease_ttl_s = config.lease_ttl_s
        self._published = 0
        self._skipped_ticks = 0
        self._leases_granted = 0
        self._failures = 0
        self._last_heartbeat: WorkerHeartbeat | None = None
        self._started = False
        self._deregistered = False
        self._deregister_lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None

    # ---- inspection (metrics and tests) -----------------------------------------

    @property
    def config(self) -> HeartbeatPublisherConfig:
        return self._config

    @property
    def key(self) -> str:
        """The etcd key this Worker publishes under."""
        return self._key.decode()

    @property
    def published(self) -> int:
        """Heartbeat puts etcd acknowledged."""
        return self._published

    @property
    def lease_id(self) -> int | None:
        """The lease the key is attached to; None before the first grant and after
        a lost lease or ``deregister``."""
        return self._lease_id

    @property
    def last_heartbeat(self) -> WorkerHeartbeat | None:
        """The last heartbeat etcd acknowledged."""
        return self._last_heartbeat

    @property
    def skipped_ticks(self) -> int:
        """Heartbeat ticks skipped because the previous put was still in flight."""
        return self._skipped_ticks

    @property
    def leases_granted(self) -> int:
        return self._leases_granted

    @property
    def failures(self) -> int:
        """Connections given up after a failure (each was logged once)."""
        return self._failures

    @property
    def deregistered(self) -> bool:
        return self._deregistered

    # ---- lifecycle -----------------------------------------------------------------

    async def run(self) -> None:
        """Publish until cancelled; return once ``deregister`` has stopped publishing."""
        if self._started:
            raise RuntimeError("EtcdHeartbeatPublisher.run() may only be called once")
        self._started = True
        if self._deregistered:
            return
        task = asyncio.create_task(self._publish_loop(), name=f"etcd-heartbeat {self.key}")
        self._loop_task = task
        try:
            # wait() rather than await: deregister() cancelling the loop must not
            # look like run() itself was cancelled.
            await asyncio.wait([task])
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not task.cancelled():
            task.result()  # the loop only ends by cancellation; surface anything else

    async def deregister(self) -> None:
        """Stop publishing and revoke the lease, deleting the key at once.

        Idempotent. When etcd cannot be reached the failure is logged and the key
        goes away when its lease expires.
        """
        async with self._deregister_lock:
            if self._deregistered:
                return
            self._deregistered = True
            task = self._loop_task
            if task is not None and not task.done():
                task.cancel()
                # The loop catches no CancelledError, so this returns promptly.
                await asyncio.wait([task])
            lease_id, self._lease_id = self._lease_id, None
            if lease_id is not None:
                await self._revoke(lease_id)

    # ---- the loops -----------------------------------------------------------------

    async def _publish_loop(self) -> None:
        delay_s = self._config.retry_delay_ms / 1000
        while True:
            host, port = self._endpoints[self._next_endpoint % len(self._endpoints)]
            self._next_endpoint += 1
            # A client per attempt: the next attempt goes to the next endpoint, and no
            # state of a broken channel survives into the next one.
            client = self._client(host, port)
            try:
                await self._session(client)
            except Exception as exc:
                self._on_failure(f"{host}:{port}", exc)
            finally:
                await close_quietly(client)
            await asyncio.sleep(delay_s)

    async def _session(self, client: aetcd.Client) -> None:
        """Publish over one connection; return only by raising."""
        while True:
            lease_id = await self._ensure_lease(client)
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._keep_alive(client, lease_id))
                    group.create_task(self._put_heartbeats(client, lease_id))
            except* _LeaseLost as lost:
                # The connection works: replace the lease at once, no retry delay.
                self._lease_id = None
                log.warning(
                    "etcd lease %x of %s is gone (%s); granting a new one",
                    lease_id,
                    self.key,
                    lost.exceptions[0],
                )

    async def _ensure_lease(self, client: aetcd.Client) -> int:
        """The current lease if etcd still has it, else a newly granted one."""
        lease_id = self._lease_id
        if lease_id is not None:
            # After a reconnection: the lease may have expired while etcd was out of
            # reach. A refresh both checks and extends it.
            if await self._refresh(client, lease_id):
                return lease_id
            self._lease_id = None
            log.warning(
                "etcd lease %x of %s expired while disconnected; granting a new one",
                lease_id,
                self.key,
            )
        lease = await client.lease(self._config.lease_ttl_s)
        lease_id = int(lease.id)
        # etcd may grant more than asked for (it has a minimum TTL).
        self._lease_ttl_s = max(int(lease.ttl), 1)
        self._lease_id = lease_id
        self._leases_granted += 1
        log.info("etcd lease %x granted for %s (TTL %d s)", lease_id, self.key, self._lease_ttl_s)
        return lease_id

    async def _keep_alive(self, client: aetcd.Client, lease_id: int) -> None:
        """Refresh the lease at a third of its TTL; raise ``_LeaseLost`` when etcd
        no longer has it."""
        while True:
            await asyncio.sleep(self._lease_ttl_s / 3)
            if not await self._refresh(client, lease_id):
                raise _LeaseLost("a keepalive answered TTL 0")

    async def _refresh(self, client: aetcd.Client, lease_id: int) -> bool:
        """Refresh the lease once: True if etcd still has it."""
        reply = await client.refresh_lease(lease_id)
        if reply is None:
            raise aetcd.exceptions.ClientError("the lease keepalive stream ended without a reply")
        # etcd answers a keepalive for a lease it does not have with TTL 0.
        return int(reply.TTL) > 0

    async def _put_heartbeats(self, client: aetcd.Client, lease_id: int) -> None:
        """Put a heartbeat every interval, one at a time; skip ticks a slow put missed."""
        loop = asyncio.get_running_loop()
        interval_s = self._config.interval_ms / 1000
        next_at = loop.time()
        while True:
            heartbeat = self._heartbeat()
            try:
                await client.put(self._key, encode_heartbeat(heartbeat), lease=lease_id)
            except aetcd.exceptions.ClientError as exc:
                if _lease_not_found(exc):
                    raise _LeaseLost("a put answered lease not found") from exc
                raise
            self._published += 1
            self._last_heartbeat = heartbeat
            next_at += interval_s
            now = loop.time()
            if next_at <= now:
                # The put outlasted one or more ticks: resume on the schedule instead
                # of sending a burst of catch-up puts to an etcd that is already slow.
                missed = math.floor((now - next_at) / interval_s) + 1
                self._skipped_ticks += missed
                next_at += missed * interval_s
            await asyncio.sleep(next_at - now)

    def _heartbeat(self) -> WorkerHeartbeat:
        now_ms = self._clock.now_ms()
        task_slots, reserved_slots, running_tasks = self._load.heartbeat_counts(now_ms)
        system = self._metrics.sample()
        return WorkerHeartbeat(
            worker_addr=self._config.worker_addr,
            task_slots=non_negative(task_slots),
            reserved_slots=non_negative(reserved_slots),
            running_tasks=non_negative(running_tasks),
            cpu_percent=system.cpu_fraction,
            memory_percent=system.memory_fraction,
            memory_available_bytes=system.memory_available_bytes,
            memory_total_bytes=system.memory_total_bytes,
            process_rss_bytes=system.process_rss_bytes,
            error_rate=fraction(self._load.error_rate(now_ms)),
            last_heartbeat_ms=now_ms,
        )

    # ---- deregistration --------------------------------------------------------------

    async def _revoke(self, lease_id: int) -> None:
        """Revoke the lease through the first endpoint that answers."""
        errors: list[str] = []
        for offset in range(len(self._endpoints)):
            index = (self._next_endpoint + offset) % len(self._endpoints)
            host, port = self._endpoints[index]
            client = self._client(host, port)
            try:
                await client.revoke_lease(lease_id)
            except _NETWORK_ERRORS as exc:
                if _lease_not_found(exc):
                    log.info("etcd lease %x of %s was already gone", lease_id, self.key)
                    return
                errors.append(f"{host}:{port}: {type(exc).__name__}: {_one_line(exc)}")
            else:
                log.info("deregistered %s: etcd lease %x revoked", self.key, lease_id)
                return
            finally:
                await close_quietly(client)
        log.warning(
            "deregistering %s: could not revoke etcd lease %x (%s); "
            "the key goes when the lease expires",
            self.key,
            lease_id,
            "; ".join(errors),
        )

    # ---- helpers -------------------------------------------------------------------

    def _client(self, host: str, port: int) -> aetcd.Client:
        return open_client(
            host,
            port,
            timeout_s=self._rpc_timeout_s,
            options=self._grpc_options,
            security=self._config.security,
        )

    def _on_failure(self, endpoint: str, exc: Exception) -> None:
        self._failures += 1
        cause = _first_leaf(exc)
        delay_ms = self._config.retry_delay_ms
        if isinstance(cause, _NETWORK_ERRORS):
            log.warning(
                "etcd heartbeat of %s via %s failed: %s: %s; retrying in %d ms",
                self.key,
                endpoint,
                type(cause).__name__,
                _one_line(cause),
                delay_ms,
            )
        else:
            # A bug rather than a network fault: keep the traceback, keep publishing.
            log.error(
                "etcd heartbeat of %s via %s crashed; retrying in %d ms",
                self.key,
                endpoint,
                delay_ms,
                exc_info=cause,
            )


def _first_leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the one worth logging."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "no detail"


def _lease_not_found(exc: BaseException) -> bool:
    """Whether etcd answered a put or revoke with NOT_FOUND, its answer for a lease
    it does not have (aetcd wraps that status in a ClientError it raises from it)."""
    cause = exc.__cause__
    not_found = aetcd.rpc.StatusCode.NOT_FOUND
    return isinstance(cause, aetcd.rpc.AioRpcError) and cause.code() is not_found
