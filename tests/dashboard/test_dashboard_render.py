"""The dashboard's values and templates without a cluster: calls progress is shown
once the task has made calls, the numbers read as labelled, whatever a source sends
them, a job record out of bounds is a bad record naming why, and a running job
whose driver stopped updating it reads interrupted."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from blockx_cli.dashboard.app import Dashboard
from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.formatting import FILTERS, age, percent, timestamp
from blockx_cli.dashboard.jobs_source import bad_row, job_row, jobs_page
from blockx_cli.dashboard.sources import task_row, worker_page
from blockx_cli.dashboard.views import JobsPage, TaskPage, TaskRow, TasksPage
from blockx_client import (
    CallsWaiting,
    Client,
    ExecutorState,
    FailureCode,
    ListedTask,
    RunningCall,
    TaskState,
    WorkerDescription,
)
from blockx_drive import JobProgress
from blockx_drive.jobs import STALE_AFTER_MS, decode_job
from blockx_drive.jobs import BadJobRecord as BadRecord

NOW_MS = 1_764_619_564_120


def _listed(*, calls_done: int, calls_total: int, calls_total_known: bool) -> ListedTask:
    return ListedTask(
        task_id="t-1",
        state=TaskState.RUNNING,
        worker_addr="127.0.0.1:1",
        function="echo",
        created_ms=NOW_MS - 1_500,
        calls_done=calls_done,
        calls_total=calls_total,
        calls_total_known=calls_total_known,
    )


def _render(rows: tuple[TaskRow, ...]) -> str:
    dashboard = Dashboard(DashboardConfig(etcd_endpoints=("127.0.0.1:1",)), Client)
    page = TasksPage(
        now_ms=NOW_MS,
        state="",
        function="",
        q="",
        limit=500,
        counts={"RUNNING": len(rows)},
        matching=len(rows),
        tasks=rows,
    )
    template = dashboard.templates.get_template("tasks.html")
    return template.render(refresh_s=5.0, page="tasks", view=page, api="/api/tasks")


def test_a_task_without_calls_shows_no_progress() -> None:
    row = task_row(ListedTask(task_id="t-0", state=TaskState.RUNNING, worker_addr="a:1"), NOW_MS)
    assert (row.calls_done, row.calls_total, row.calls_total_known) == (None, None, None)
    assert "<progress" not in _render((row,))


def test_known_total_is_a_bar_and_a_fraction() -> None:
    row = task_row(_listed(calls_done=3, calls_total=10, calls_total_known=True), NOW_MS)
    assert (row.calls_done, row.calls_total, row.age_ms) == (3, 10, 1_500)
    html = _render((row,))
    assert '<progress max="10" value="3"></progress> 3/10' in html


def test_a_total_not_known_yet_says_so() -> None:
    row = task_row(_listed(calls_done=7, calls_total=7, calls_total_known=False), NOW_MS)
    html = _render((row,))
    assert "7/7" in html
    assert "total not known yet" in html
    assert "<progress" not in html


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "\N{EN DASH}"), (850, "850 ms"), (3_200, "3.2 s"), (246_000, "4.1 min")],
)
def test_ages(ms: int | None, text: str) -> None:
    assert age(ms) == text


def test_fractions_read_as_percentages_and_times_as_utc() -> None:
    assert percent(0.682) == "68.2 %"
    assert timestamp(NOW_MS) == "2025-12-01 20:06:04.120Z"


@pytest.mark.parametrize("name", sorted(set(FILTERS) - {"quote", "shorten"}))
@pytest.mark.parametrize(
    "value", [math.inf, -math.inf, math.nan, 1e308, -1e308, 2**63 - 1, -(2**63), 0, None]
)
def test_filters_read_any_number(name: str, value: float | None) -> None:
    if name == "size" and value is None:
        return  # sizes are never unknown
    assert isinstance(FILTERS[name](value), str)


GOOD = b'{"job_id": "j", "kind": "follow", "state": "running", "started_ms": 1, "updated_ms": 2'

RECORDS = [
    # (the record's JSON after GOOD's fields, what the reason names; "" = a good record)
    (b', "eta_s": 4.5, "lag_ms": -5000}', ""),
    (b', "eta_s": 1e15, "blocks_per_s": 1e-9}', ""),
    (b', "eta_s": 1e308}', "$.eta_s"),
    (b', "eta_s": 1.1e15}', "$.eta_s"),
    (b', "eta_s": 1e400}', "$.eta_s"),
    (b', "eta_s": -1}', "$.eta_s"),
    (b', "blocks_per_s": Infinity}', "not JSON"),
    (b', "head": 9223372036854775808}', "$.head"),
    (b', "from_block": 1.5}', "$.from_block"),
    (b', "message": ["a"]}', "$.message"),
    (b', "kind": "rebuild"}', "$.kind"),
    (b', "sink_table": "' + b"t" * 257 + b'"}', "$.sink_table"),
    (b"", "not JSON"),
]


@pytest.mark.parametrize(("rest", "named"), RECORDS)
def test_job_records_are_bounded(rest: bytes, named: str) -> None:
    decoded = decode_job(GOOD + rest)
    if not named:
        assert isinstance(decoded, JobProgress)
        return
    assert isinstance(decoded, str)
    assert named in decoded


def test_a_bad_record_is_one_row_and_the_jobs_are_shown() -> None:
    job = decode_job(GOOD + b', "eta_s": 3153600000}')
    assert isinstance(job, JobProgress)
    bad = bad_row(BadRecord(job_id="<b>x</b>", error="not JSON"))
    dashboard = Dashboard(DashboardConfig(etcd_endpoints=("127.0.0.1:1",)), Client)
    page = JobsPage(now_ms=NOW_MS, jobs=(job_row(job, NOW_MS),), bad_records=(bad,))
    html = dashboard.templates.get_template("jobs.html").render(
        refresh_s=5.0, page="jobs", view=page, api="/api/jobs"
    )
    assert html.count('<tr class="bad-record"') == 1
    assert "&lt;b&gt;x&lt;/b&gt;" in html
    assert 'data-job-id="j"' in html


def _page(template: str, page: str, view: object) -> str:
    dashboard = Dashboard(DashboardConfig(etcd_endpoints=("127.0.0.1:1",)), Client)
    return dashboard.templates.get_template(template).render(
        refresh_s=5.0, page=page, view=view, api=f"/api/{page}"
    )


EXPIRED = ListedTask(
    task_id="t-old",
    state=TaskState.FAILED,
    worker_addr="127.0.0.1:1",
    function="boom",
    created_ms=NOW_MS - 3_600_000,
    converged_ms=NOW_MS - 3_599_000,
    failure_code=FailureCode.CALL_FAILED,
    failure_summary="ValueError: boom",
    expired=True,
)


def test_an_expired_failure_is_marked_on_the_tasks_page_and_its_own() -> None:
    row = task_row(EXPIRED, NOW_MS)
    assert row.expired
    page = TasksPage(
        now_ms=NOW_MS,
        state="",
        function="",
        q="",
        limit=500,
        counts={"FAILED": 1},
        matching=1,
        tasks=(row,),
        expired=1,
    )
    html = _page("tasks.html", "tasks", page)
    assert '<tr data-task-id="t-old" class="expired">' in html
    assert "(1 expired)" in html
    detail = _page(
        "task.html", "task", TaskPage(now_ms=NOW_MS, task_id="t-old", holders=(), expired=(row,))
    )
    assert "Its result has expired" in detail
    assert "CALL_FAILED" in detail
    assert "No registered worker knows this task" not in detail


def test_a_worker_page_with_a_cancelled_call_and_nothing_running() -> None:
    stopping = ExecutorState(
        executor_id="x0.1",
        pid=42,
        running=RunningCall(
            call_id=7,
            task_id="",
            function="",
            root_index=-1,
            attempt=0,
            held_ms=900,
            cancelled=True,
        ),
        calls_queued=0,
        calls_suspended=0,
        calls_started=3,
        rss_bytes=0,
    )
    described = WorkerDescription(
        worker_addr="127.0.0.1:1",
        program="blockx-worker",
        now_ms=NOW_MS,
        started_ms=NOW_MS - 60_000,
        ready=True,
        draining=False,
        task_slots=4,
        reserved_slots=0,
        running_tasks=0,
        executors_configured=2,
        executors=(stopping,),
        executor_restarts=1,
        calls_waiting=CallsWaiting(),
        calls_in_flight=0,
        code_epoch=3,
        process_rss_bytes=1 << 20,
        call_deadline_ms=5_000,
        call_wall_limit_ms=15_000,
        running=(),
        recent_failures=(EXPIRED,),
        failed_tasks_kept=1_000,
        result_retention_ms=300_000,
        load_interval_ms=10_000,
        load=(),
    )
    html = _page("worker.html", "worker", worker_page(described, "block", NOW_MS))
    assert "call 7 cancelled, still stopping" in html
    assert '<span class="bad">1 up</span>' in html  # one of two executors connected
    assert "No task is running." in html
    assert '<tr data-task-id="t-old" class="expired">' in html
    assert '<figure class="chart">' not in html  # no load points: no charts


def test_a_running_job_not_updated_for_a_minute_reads_interrupted() -> None:
    job = decode_job(GOOD + b"}")
    assert isinstance(job, JobProgress)
    assert job_row(job, job.updated_ms + STALE_AFTER_MS).state == "running"
    assert job_row(job, job.updated_ms + STALE_AFTER_MS + 1).state == "interrupted"


async def test_the_jobs_page_says_when_it_has_no_sink_and_makes_none(tmp_path: Path) -> None:
    config = DashboardConfig(etcd_endpoints=("127.0.0.1:1",))
    [problem] = (await jobs_page(config)).problems
    assert "no sink database is configured: pass --sink-db, set SINK_DB_URL" in problem.error
    missing = tmp_path / "typo.db"
    typo = msgspec.structs.replace(config, sink_db_url=f"sqlite:///{missing}")
    [problem] = (await jobs_page(typo)).problems
    assert (problem.source, problem.error) == (
        f"sink sqlite:///{missing}",
        f"no sink database at {missing}",
    )
    assert not missing.exists()
