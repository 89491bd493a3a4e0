"""What each page shows, as values: the templates render them and ``/api/...``
serves them as JSON, so a page and its JSON twin never disagree.

Every page carries ``problems``: a source that did not answer (etcd, a Worker,
the Coordinator) is a value on the page, never an error page.
"""

from __future__ import annotations

import msgspec

from blockx_client import (
    CallFailureSummary,
    CallsWaiting,
    ExecutorState,
    LoadPoint,
    WorkerEligibility,
)
from blockx_client.models import RecentRefusal
from blockx_drive.jobs import JobFailure


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """``source`` did not answer, or refused: ``etcd``, ``worker HOST:PORT``, ..."""

    source: str
    error: str


class WorkerRow(msgspec.Struct, frozen=True, kw_only=True):
    worker_addr: str
    cluster: str  # block, bundle, or the registry prefix itself
    registry_prefix: str
    task_slots: int
    reserved_slots: int
    running_tasks: int
    used_slots: int
    # Fractions 0..1, as the heartbeat carries them (its cpuPercent / memoryPercent).
    cpu_fraction: float
    memory_fraction: float
    error_rate: float
    memory_total_bytes: int
    memory_available_bytes: int
    process_rss_bytes: int
    heartbeat_age_ms: int


class WorkersPage(msgspec.Struct, frozen=True, kw_only=True):
    now_ms: int
    workers: tuple[WorkerRow, ...]
    problems: tuple[Problem, ...] = ()
    # The heartbeat has no code epoch: say where it is instead of showing a guess.
    code_epoch_note: str = ""


class TaskRow(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    state: str
    worker_addr: str
    function: str
    call_builder: str
    slot_id: str
    created_ms: int
    converged_ms: int
    # The chain its Builder config names; "" when it names none.
    chain: str = ""
    age_ms: int
    failure_code: str
    failure_summary: str
    tombstone: bool
    call_failures: int
    # Calls progress, when the Worker reports it (None: not reported).
    calls_done: int | None = None
    calls_total: int | None = None
    calls_total_known: bool | None = None
    # A failed task whose result has expired: the Worker keeps only this summary.
    expired: bool = False


class TasksPage(msgspec.Struct, frozen=True, kw_only=True):
    now_ms: int
    state: str
    function: str
    q: str
    limit: int
    # Tasks by state among those matching ``function`` and ``q`` (every state).
    counts: dict[str, int]
    # How many match every filter; ``tasks`` holds the newest ``limit`` of them.
    matching: int
    tasks: tuple[TaskRow, ...]
    # Of the FAILED count, the failures whose results have expired.
    expired: int = 0
    # Only tasks first seen in [since_ms, until_ms] (0: no bound): a job's tasks.
    since_ms: int = 0
    until_ms: int = 0
    workers_asked: tuple[str, ...] = ()
    # Workers holding more tasks than one listing takes (their oldest are shown).
    truncated_workers: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    reached: bool
    at_ms: int | None = None
    note: str = ""


class PluginRow(msgspec.Struct, frozen=True, kw_only=True):
    plugin_name: str
    success: bool
    failure_code: str
    failure_message: str
    result_bytes: int
    # The first bytes of the result as text, for a glance (the API has it all).
    result_preview: str


class TaskDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One Worker's answer for the task (normally the only one)."""

    worker_addr: str
    state: str
    phases: tuple[Phase, ...]
    listed: TaskRow | None
    success: bool
    failure_code: str
    failure_message: str
    retryable: bool
    attempt: int
    original_task_id: str
    may_have_run: bool
    plugin_results: tuple[PluginRow, ...]
    call_failures: tuple[CallFailureSummary, ...]
    call_failures_omitted: int


class TaskPage(msgspec.Struct, frozen=True, kw_only=True):
    now_ms: int
    task_id: str
    holders: tuple[TaskDetail, ...]
    # No Worker holds it, but some remember it failed: its results expired.
    expired: tuple[TaskRow, ...] = ()
    workers_asked: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()


class PlacementPage(msgspec.Struct, frozen=True, kw_only=True):
    now_ms: int
    cluster: str  # block or bundle: whose coordinator answered
    coordinator: str
    # None: the Coordinator did not answer.
    view_trusted: bool | None
    not_ready_reason: str
    workers: tuple[WorkerEligibility, ...]
    # The coordinator's last refused reservations, newest first, each explained.
    recent_refusals: tuple[RecentRefusal, ...] = ()
    # No coordinator of this cluster was given to the dashboard.
    not_configured: bool = False
    problems: tuple[Problem, ...] = ()


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    kind: str
    # running, finished, failed, stopped; interrupted: running, but its driver has
    # not updated it for STALE_AFTER_MS (it died).
    state: str
    started_ms: int
    updated_ms: int
    updated_age_ms: int
    ended_ms: int | None
    function: str
    sink_table: str
    # The chain its tasks read ("": the Workers' only chain) and the chain id of the
    # block database it planned from (None: a record made before jobs kept it).
    chain: str
    chain_id: int | None
    # Every task of the job has an id starting with this.
    task_prefix: str
    # The command line (or Python call) that started it.
    command: str
    from_block: int
    to_block: int | None
    blocks_total: int | None
    blocks_done: int
    # blocks_done / blocks_total when the total is known.
    fraction_done: float | None
    rows_done: int
    tasks_done: int
    tasks_failed: int
    retries: int
    blocks_per_s: float
    eta_s: float | None
    head: int | None
    last_block: int | None
    # The block database's head minus the highest block written (None: unknown).
    head_lag_blocks: int | None
    # A follow's: when it wrote its last block, since ingest stored that block
    # (lag_from "ingest") or follow first saw it ("follow").
    lag_ms: int | None
    lag_from: str | None
    # The last tasks that failed for good: blocks, task id, code, message.
    failures: tuple[JobFailure, ...]
    message: str


class BadJobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A row of the sink's job records that is not a job the page can show: its job
    id (``key``) and why (not JSON, too big, a field of the wrong type or out of
    bounds)."""

    key: str
    error: str


class BlockDbState(msgspec.Struct, frozen=True, kw_only=True):
    """What the block database the jobs read holds: whole blocks, or (a selective
    ingest, ``--logs``) only the logs of ``addresses`` with ``topic0s`` (empty: any)
    from ``from_block`` on."""

    database: str
    holds: str  # "whole blocks", "logs" or "nothing yet"
    head: int | None = None
    finalized: int | None = None
    epoch: int | None = None
    addresses: tuple[str, ...] = ()
    topic0s: tuple[str, ...] = ()
    from_block: int | None = None


class JobsPage(msgspec.Struct, frozen=True, kw_only=True):
    now_ms: int
    jobs: tuple[JobRow, ...]
    bad_records: tuple[BadJobRecord, ...] = ()
    problems: tuple[Problem, ...] = ()
    blockdb: BlockDbState | None = None


class RunningTaskRow(msgspec.Struct, frozen=True, kw_only=True):
    task: TaskRow
    phase: str
    deadline_in_ms: int


class WorkerPage(msgspec.Struct, frozen=True, kw_only=True):
    """One Worker now (its DescribeWorker); ``answered`` false: only ``problems``."""

    now_ms: int
    worker_addr: str
    answered: bool = False
    cluster: str = ""
    program: str = ""
    ready: bool = False
    draining: bool = False
    uptime_ms: int = 0
    task_slots: int = 0
    used_slots: int = 0
    running_tasks: int = 0
    executors_configured: int = 0
    executors_busy: int = 0
    # Busy first, the longest-held call first; then idle. A call held ``long_call_ms``
    # or more is highlighted.
    executors: tuple[ExecutorState, ...] = ()
    executor_restarts: int = 0
    calls_waiting: CallsWaiting = CallsWaiting()
    calls_in_flight: int = 0
    code_epoch: int = 0
    process_rss_bytes: int = 0
    executors_rss_bytes: int = 0
    call_deadline_ms: int = 0
    call_wall_limit_ms: int = 0
    long_call_ms: int = 0
    # Oldest first (the longest running on top).
    running: tuple[RunningTaskRow, ...] = ()
    recent_failures: tuple[TaskRow, ...] = ()
    failed_tasks_kept: int = 0
    result_retention_ms: int = 0
    load_interval_ms: int = 0
    # Oldest first; the last is the interval in progress.
    load: tuple[LoadPoint, ...] = ()
    problems: tuple[Problem, ...] = ()
