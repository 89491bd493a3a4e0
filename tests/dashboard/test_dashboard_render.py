"""The dashboard's values and templates without a cluster: calls progress is shown
once the task has made calls, and the numbers read as labelled."""

from __future__ import annotations

import pytest

from blockx_cli.dashboard.app import Dashboard
from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.formatting import age, percent, timestamp
from blockx_cli.dashboard.sources import task_row
from blockx_cli.dashboard.views import TaskRow, TasksPage
from blockx_client import Client, ListedTask, TaskState

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
