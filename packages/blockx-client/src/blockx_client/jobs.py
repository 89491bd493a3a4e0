"""Backfill and follow jobs as the cluster sees them: one record per job in etcd.

A backfill or a follow runs in its caller's process, not on the cluster, so
nothing on the cluster knows how far it got. A ``JobPublisher`` puts the job's
latest ``JobProgress`` under ``<prefix><kind>/<job_id>``, bound to a lease the
publisher keeps alive: a job whose process dies disappears within
``RUNNING_TTL_S``. A finished job's last record is kept for ``FINISHED_TTL_S``
so a dashboard still shows how it ended. ``list_jobs`` reads them all.

Publishing never slows or stops the job: ``publish`` only records the latest
state; a background task writes it at most once per ``interval_s`` (and renews
the lease when nothing changed), and an etcd that cannot be reached is logged
once and tried again on the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Annotated, Final

import msgspec

from blockx_client._etcd_gateway import EtcdAccess, Gateway, Refused, first_answer
from blockx_client.errors import ConnectError

JOBS_PREFIX = "/blockx/jobs/"
RUNNING_TTL_S = 30
FINISHED_TTL_S = 600
DEFAULT_INTERVAL_S = 1.0

_log = logging.getLogger(__name__)


class JobKind(enum.Enum):
    BACKFILL = "backfill"
    FOLLOW = "follow"


class JobState(enum.Enum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


# The bounds of a record's values, checked when one is decoded: whoever can write
# etcd can write a record, and a reader must be able to show every value it
# accepts. The publishers' values stay well inside them.
MAX_RECORD_BYTES: Final = 64 * 1024
# The last ms of year 9999: the latest time a date can be shown for.
MAX_UNIX_MS: Final = 253_402_300_799_999
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
UnixMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_UNIX_MS)]
# Signed: a chain's block timestamps can run ahead of the clock.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Finite and not negative; a stalled job's ETA can be very large.
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e15)]
Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]
Name = Annotated[str, msgspec.Meta(max_length=256)]


class JobProgress(msgspec.Struct, frozen=True, kw_only=True):
    """One job's latest state, as its record in etcd holds it (JSON); decoding one
    checks the bounds above."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    kind: JobKind
    state: JobState
    started_ms: UnixMs
    updated_ms: UnixMs
    function: Name = ""
    sink_table: Name = ""
    from_block: Count = 0
    to_block: Count | None = None  # None: follow, no end
    blocks_total: Count | None = None
    blocks_done: Count = 0
    rows_done: Count = 0
    tasks_done: Count = 0
    tasks_failed: Count = 0
    retries: Count = 0
    blocks_per_s: Rate = 0.0
    eta_s: Seconds | None = None
    head: Count | None = None  # the block database's head the job last saw
    last_block: Count | None = None  # the highest block the job wrote
    lag_ms: Int64 | None = None  # now minus the last written block's timestamp (follow)
    message: Annotated[str, msgspec.Meta(max_length=2_000)] = ""  # the last failure, if any

    @property
    def head_lag_blocks(self) -> int | None:
        """Blocks between the head the job last saw and the highest it wrote."""
        if self.head is None or self.last_block is None:
            return None
        return max(self.head - self.last_block, 0)


def job_key(prefix: str, kind: JobKind, job_id: str) -> str:
    return f"{prefix}{kind.value}/{job_id}"


async def read_job_records(
    endpoints: list[str],
    *,
    prefix: str = JOBS_PREFIX,
    timeout_s: float = 5.0,
    access: EtcdAccess | None = None,
) -> list[tuple[bytes, bytes]]:
    """Every (key, value) under ``prefix`` as etcd holds it, undecoded: for a reader
    that shows the records it cannot use (``blockx dashboard``). ``access`` defaults
    to ``EtcdAccess.from_environ()``."""
    try:
        return await first_answer(
            endpoints, access, timeout_s, lambda gateway: gateway.range_prefix(prefix)
        )
    except ConnectError as exc:
        raise ConnectError(f"cannot read the jobs from etcd ({exc})") from None


async def list_jobs(
    endpoints: list[str],
    *,
    prefix: str = JOBS_PREFIX,
    timeout_s: float = 5.0,
    access: EtcdAccess | None = None,
) -> list[JobProgress]:
    """Every job recorded under ``prefix``, newest first, from the first endpoint
    that answers; a value that is not a job record within bounds is skipped."""
    records = await read_job_records(endpoints, prefix=prefix, timeout_s=timeout_s, access=access)
    jobs = [job for _key, value in records if isinstance(job := decode_job(value), JobProgress)]
    return sorted(jobs, key=lambda job: (-job.started_ms, job.job_id))


_decoder: Final = msgspec.json.Decoder(JobProgress)


def decode_job(value: bytes) -> JobProgress | str:
    """The job record ``value``, or why it is not one (too big, not JSON, a field of
    the wrong type or out of bounds, naming it)."""
    if len(value) > MAX_RECORD_BYTES:
        return f"{len(value):,} bytes; a job record is at most {MAX_RECORD_BYTES:,}"
    try:
        return _decoder.decode(value)
    except msgspec.ValidationError as exc:
        return str(exc)
    except msgspec.DecodeError as exc:
        return f"not JSON: {exc}"


def new_job_id(kind: JobKind) -> str:
    return f"{kind.value}-{uuid.uuid4().hex[:12]}"


class JobPublisher:
    """Publishes one job's record while the job runs (``async with``)."""

    def __init__(
        self,
        endpoints: list[str],
        kind: JobKind,
        *,
        job_id: str | None = None,
        prefix: str = JOBS_PREFIX,
        access: EtcdAccess | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = 5.0,
    ) -> None:
        if not endpoints:
            raise ValueError("JobPublisher needs at least one etcd endpoint")
        self.kind = kind
        self.job_id = job_id or new_job_id(kind)
        self.key = job_key(prefix, kind, self.job_id)
        self._endpoints = list(endpoints)
        self._access = EtcdAccess.from_environ() if access is None else access
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._latest: JobProgress | None = None
        self._written: JobProgress | None = None
        self._closing = asyncio.Event()
        self._lease = 0
        self._renewed = 0.0
        self._warned = False
        self._loop: asyncio.Task[None] | None = None

    async def __aenter__(self) -> JobPublisher:
        self._loop = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The loop finishes the write under way (a thread cannot be cancelled), so
        # the final record is never overwritten by an older one.
        self._closing.set()
        if self._loop is not None:
            await asyncio.gather(self._loop, return_exceptions=True)
        latest = self._latest
        if latest is None:
            return
        if latest.state is JobState.RUNNING:
            # The job ended without saying how: an exception or a cancellation.
            if exc is None or isinstance(exc, asyncio.CancelledError):
                message = latest.message or "interrupted"
            else:
                message = latest.message or repr(exc)
            latest = msgspec.structs.replace(
                latest, state=JobState.FAILED, message=message, updated_ms=_now_ms()
            )
        try:
            await first_answer(self._endpoints, self._access, self._timeout_s, self._finish(latest))
        except ConnectError as error:
            self._warn(error)

    async def publish(self, progress: JobProgress) -> None:
        """Record ``progress`` as the job's latest state; written soon after."""
        self._latest = progress

    async def _run(self) -> None:
        while not self._closing.is_set():
            latest = self._latest
            if latest is not None and (latest is not self._written or self._renewal_due()):
                try:
                    await first_answer(
                        self._endpoints, self._access, self._timeout_s, self._write(latest)
                    )
                    self._written = latest
                except ConnectError as error:
                    self._warn(error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self._interval_s)

    def _write(self, progress: JobProgress) -> Callable[[Gateway], None]:
        def write(gateway: Gateway) -> None:
            if self._renewal_due():
                try:
                    gateway.keep_alive(self._lease)
                    self._renewed = time.monotonic()
                except Refused:
                    self._lease = 0  # it expired while etcd was out of reach
            if not self._lease:
                self._lease = gateway.grant(RUNNING_TTL_S)
                self._renewed = time.monotonic()
            gateway.put(self.key, msgspec.json.encode(progress), lease=self._lease)

        return write

    def _renewal_due(self) -> bool:
        """A third of the lease has passed since it was granted or renewed."""
        return bool(self._lease) and time.monotonic() - self._renewed > RUNNING_TTL_S / 3

    def _finish(self, progress: JobProgress) -> Callable[[Gateway], None]:
        def finish(gateway: Gateway) -> None:
            kept = gateway.grant(FINISHED_TTL_S)
            gateway.put(self.key, msgspec.json.encode(progress), lease=kept)
            if self._lease:
                gateway.revoke(self._lease)
                self._lease = 0

        return finish

    def _warn(self, error: BaseException) -> None:
        if not self._warned:
            self._warned = True
            _log.warning("cannot publish job %s to etcd: %s", self.job_id, error)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
