"""Backfill and follow jobs: one record per run, kept in the sink the job writes.

A backfill or a follow runs in its caller's process, not on the cluster, so
nothing on the cluster knows how far it got. The driver keeps a record of its run
(``JobProgress``) in the sink it writes, in ``_blockx_jobs`` beside the
``_blockx_written`` ledger (``blockx_chain.sink.jobs``): its plan, progress,
last failures, start and end, and the command that started it. Records are
durable: they outlive the driver's process and are kept until the sink holds
``JOBS_KEPT`` newer ended ones. Every run is a record of its own: a follow
restarted (or a backfill run again to resume) starts a new one.

``JobRecorder`` writes a running job's record: at once when the job starts, then
at most once per ``interval_s`` as it changes, and at least once per
``refresh_s`` while it does not, so a hot follow costs a write a second, not a
write per block. A record whose driver died stops being updated: a RUNNING record
not updated for ``STALE_AFTER_MS`` reads as INTERRUPTED (``shown_state``).
Recording never slows or stops the job: a sink that cannot be written is logged
once and tried again on the next round.

``list_jobs`` reads them back. Whoever can write the sink can write a record, so
every value read is checked against the bounds of ``JobProgress``; a record that
is not one is skipped (``decode_job`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import time
import uuid
from types import TracebackType
from typing import Annotated, Any, Final

import msgspec

from blockx_chain.sink import JobEntry, SinkStore, open_sink
from blockx_chain.url import BlockDbUrl

DEFAULT_INTERVAL_S: Final = 1.0
DEFAULT_REFRESH_S: Final = 10.0
# Six refreshes missed: the driver is gone (killed, its host lost) or has not
# reached its sink for a minute.
STALE_AFTER_MS: Final = 60_000
DEFAULT_LIST_LIMIT: Final = 100
MAX_LIST_LIMIT: Final = 10_000
# The failures a record keeps: the last ones.
MAX_FAILURES: Final = 20
MAX_MESSAGE: Final = 500
MAX_COMMAND: Final = 2_000

_log = logging.getLogger(__name__)


class JobKind(enum.Enum):
    BACKFILL = "backfill"
    FOLLOW = "follow"


class JobState(enum.Enum):
    RUNNING = "running"
    # A backfill that ran to its end with every task written.
    FINISHED = "finished"
    # Blocks failed for good, or the driver ended with an error.
    FAILED = "failed"
    # Stopped before its end by its caller (Ctrl-C, SIGTERM, the iteration closed):
    # what was written stays, a re-run resumes. A follow's usual end.
    STOPPED = "stopped"
    # Never written: how a RUNNING record whose driver stopped updating it for
    # STALE_AFTER_MS reads (``JobProgress.shown_state``).
    INTERRUPTED = "interrupted"


class LagFrom(enum.Enum):
    """What a follow's lag is measured from."""

    # When ingest stored the block (the block database's ``blocks.seen_at_ms``).
    INGEST = "ingest"
    # When follow first saw the block: it has no ``seen_at_ms`` (stored before the
    # block database recorded it).
    FOLLOW = "follow"


# The bounds of a record's values, checked when one is decoded: whoever can write
# the sink can write a record, and a reader must be able to show every value it
# accepts. The drivers' values stay well inside them.
MAX_RECORD_BYTES: Final = 64 * 1024
# The last ms of year 9999: the latest time a date can be shown for.
MAX_UNIX_MS: Final = 253_402_300_799_999
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
UnixMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_UNIX_MS)]
# Signed: a clock can be behind the one that stamped a block.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Finite and not negative; a stalled job's ETA can be very large.
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e15)]
Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]
Name = Annotated[str, msgspec.Meta(max_length=256)]
Message = Annotated[str, msgspec.Meta(max_length=2_000)]


class JobFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A task that failed for good: its blocks, its task id, why."""

    at_ms: UnixMs
    from_block: Count
    to_block: Count
    task_id: Name
    attempt: Count
    code: Name
    message: Message


class JobProgress(msgspec.Struct, frozen=True, kw_only=True):
    """One job's record, as the sink holds it (JSON); decoding one checks the
    bounds above."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    kind: JobKind
    state: JobState
    started_ms: UnixMs
    # When its driver last wrote it: a RUNNING record older than STALE_AFTER_MS
    # has lost its driver.
    updated_ms: UnixMs
    ended_ms: UnixMs | None = None
    # How the job was started: a command line, or the Python call (URLs' passwords
    # redacted).
    command: Message = ""
    function: Name = ""
    source_table: Name = ""
    sink_table: Name = ""
    # The chain the job's tasks read (its --chain; "": the Workers' only chain) and
    # the chain id of the block database it planned from (None: a record made before
    # jobs recorded it).
    chain: Name = ""
    chain_id: Count | None = None
    # Every task the job submits has an id starting with this.
    task_prefix: Name = ""
    from_block: Count = 0
    to_block: Count | None = None  # None: follow, no end
    blocks_total: Count | None = None
    tasks_total: Count | None = None  # the tasks planned (backfill)
    tasks_skipped: Count = 0  # ranges already written (backfill)
    blocks_done: Count = 0
    rows_done: Count = 0
    tasks_done: Count = 0
    tasks_failed: Count = 0
    retries: Count = 0
    blocks_per_s: Rate = 0.0
    eta_s: Seconds | None = None
    head: Count | None = None  # the block database's head the job last saw
    last_block: Count | None = None  # the highest block the job wrote
    # Follow: now minus when the last written block was stored by ingest (or first
    # seen by follow: ``lag_from``), when it was written.
    lag_ms: Int64 | None = None
    lag_from: LagFrom | None = None
    failures: Annotated[tuple[JobFailure, ...], msgspec.Meta(max_length=MAX_FAILURES)] = ()
    message: Message = ""  # the last failure, or why the job ended

    @property
    def head_lag_blocks(self) -> int | None:
        """Blocks between the head the job last saw and the highest it wrote."""
        if self.head is None or self.last_block is None:
            return None
        return max(self.head - self.last_block, 0)

    def shown_state(self, now_ms: int) -> JobState:
        """The state, INTERRUPTED for a RUNNING record its driver stopped updating."""
        if self.state is JobState.RUNNING and now_ms - self.updated_ms > STALE_AFTER_MS:
            return JobState.INTERRUPTED
        return self.state


_decoder: Final = msgspec.json.Decoder(JobProgress)
_encoder: Final = msgspec.json.Encoder()


def decode_job(value: Any) -> JobProgress | str:
    """The job record ``value`` (its JSON text), or why it is not one (too big, not
    JSON, a field of the wrong type or out of bounds, naming it)."""
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        return f"a record is JSON text, not {type(value).__name__}"
    if len(value) > MAX_RECORD_BYTES:
        return f"{len(value):,} bytes; a job record is at most {MAX_RECORD_BYTES:,}"
    try:
        return _decoder.decode(value)
    except msgspec.ValidationError as exc:
        return str(exc)
    except msgspec.DecodeError as exc:
        return f"not JSON: {exc}"


def entry(job: JobProgress) -> JobEntry:
    """``job`` as a row of ``_blockx_jobs``."""
    return JobEntry(
        job_id=job.job_id,
        kind=job.kind.value,
        state=job.state.value,
        function=job.function,
        sink_table=job.sink_table,
        started_ms=job.started_ms,
        updated_ms=job.updated_ms,
        ended_ms=job.ended_ms,
        record=_encoder.encode(job).decode(),
    )


def new_job_id(kind: JobKind) -> str:
    return f"{kind.value}-{uuid.uuid4().hex[:12]}"


# A URL's password (``scheme://user:password@host``) and ``password=`` options.
_PASSWORD: Final = re.compile(r"(?P<keep>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s]*(?=@)")
_OPTION: Final = re.compile(r"(?P<keep>password=)[^&\s]*", re.IGNORECASE)


def redacted(text: str) -> str:
    """``text`` with the passwords of the URLs in it replaced by ``***``, at most
    MAX_COMMAND characters."""
    text = _OPTION.sub(r"\g<keep>***", _PASSWORD.sub(r"\g<keep>***", text))
    return text if len(text) <= MAX_COMMAND else text[: MAX_COMMAND - 1] + "\N{HORIZONTAL ELLIPSIS}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ended(job: JobProgress, error: BaseException | None, at_ms: int) -> JobProgress:
    """The record of a job whose driver is done: the state its events gave it, else
    how the driver ended. ``error``: the exception that ended it (a cancellation or
    a closed iteration stops it)."""
    replace = msgspec.structs.replace
    if job.state is not JobState.RUNNING:
        return replace(job, ended_ms=at_ms, updated_ms=at_ms)
    if error is None:
        # A follow stopped as asked, or after a block failed for good.
        state = JobState.FAILED if job.tasks_failed else JobState.STOPPED
        return replace(job, state=state, ended_ms=at_ms, updated_ms=at_ms)
    if isinstance(error, asyncio.CancelledError | GeneratorExit | KeyboardInterrupt):
        message = job.message or "stopped before its end; a re-run resumes"
        state = JobState.STOPPED
    else:
        message = f"{type(error).__name__}: {error}".split("\n", 1)[0][:MAX_MESSAGE]
        state = JobState.FAILED
    return replace(job, state=state, message=message, ended_ms=at_ms, updated_ms=at_ms)


class JobRecorder:
    """Keeps one job's record in ``sink`` while the job runs (``async with``):
    written when entered, then as ``update`` changes it, and a last time on exit
    with how the job ended."""

    def __init__(
        self,
        sink: SinkStore,
        record: JobProgress,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self.sink = sink
        self.record = record
        self._interval_s = interval_s
        self._refresh_s = refresh_s
        self._written: JobProgress | None = None
        self._written_at = 0.0
        self._closing = asyncio.Event()
        self._warned = False
        self._loop: asyncio.Task[None] | None = None

    @property
    def job_id(self) -> str:
        return self.record.job_id

    def update(self, record: JobProgress) -> None:
        """``record`` is the job's latest state; written within ``interval_s``."""
        self.record = record

    async def __aenter__(self) -> JobRecorder:
        # The first write also trims the ended records beyond JOBS_KEPT.
        await self._write(self.record, prune=True)
        self._loop = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The loop finishes the write under way, so the last record is never
        # overwritten by an older one.
        self._closing.set()
        if self._loop is not None:
            await asyncio.gather(self._loop, return_exceptions=True)
        self.record = ended(self.record, exc, now_ms())
        await self._write(self.record)

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self._interval_s)
            if self._closing.is_set():
                return
            stale = time.monotonic() - self._written_at >= self._refresh_s
            if self.record is not self._written or stale:
                await self._write(self.record)

    async def _write(self, record: JobProgress, *, prune: bool = False) -> None:
        stamped = msgspec.structs.replace(record, updated_ms=max(record.updated_ms, now_ms()))
        try:
            await self.sink.put_job(entry(stamped), prune=prune)
        except Exception as error:  # the record is not worth stopping the job for
            if not self._warned:
                self._warned = True
                _log.warning(
                    "cannot record job %s in %s: %s", record.job_id, self.sink.description, error
                )
            return
        self._written = record
        self._written_at = time.monotonic()


class BadJobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``_blockx_jobs`` that is no job record a reader can show: its job
    id (as text, bounded) and why."""

    job_id: str
    error: str


async def read_jobs(
    url: BlockDbUrl, *, limit: int = DEFAULT_LIST_LIMIT, job_id: str | None = None
) -> list[JobProgress | BadJobRecord]:
    """The ``limit`` most recently updated job records of the sink at ``url`` (only
    ``job_id``'s when given), each checked. The sink is opened read-only: a reader
    makes nothing (SinkUnavailable when there is no such SQLite file)."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIST_LIMIT:,}, got {limit}")
    sink = await open_sink(url, read_only=True)
    try:
        rows = await sink.jobs(limit, job_id)
    finally:
        await sink.close()
    found: list[JobProgress | BadJobRecord] = []
    for row in rows:
        decoded = decode_job(row.get("record"))
        if isinstance(decoded, JobProgress) and decoded.job_id != row.get("job_id"):
            decoded = f"its record names job {decoded.job_id!r}"
        if isinstance(decoded, str):
            found.append(BadJobRecord(job_id=_shown(str(row.get("job_id"))), error=_shown(decoded)))
        else:
            found.append(decoded)
    return found


async def list_jobs(
    url: BlockDbUrl, *, limit: int = DEFAULT_LIST_LIMIT, job_id: str | None = None
) -> list[JobProgress]:
    """The job records of the sink at ``url`` (``read_jobs``), running ones first,
    then the most recently updated; a row that is no record within bounds is
    skipped."""
    jobs = [
        job
        for job in await read_jobs(url, limit=limit, job_id=job_id)
        if isinstance(job, JobProgress)
    ]
    return sorted(jobs, key=running_first)


def running_first(job: JobProgress) -> tuple[bool, int, str]:
    return job.state is not JobState.RUNNING, -job.updated_ms, job.job_id


# What of a bad row's job id and of the reason a reader shows.
MAX_SHOWN: Final = 300


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "\N{HORIZONTAL ELLIPSIS}"
