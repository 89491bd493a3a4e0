"""``blockx tasks`` marks what is left of a task: a failure whose result expired
(only its summary is kept) and a result whose outputs were dropped."""

from __future__ import annotations

from rich.console import Console

from blockx_cli.commands.tasks import _table, listed_dict
from blockx_client import ClusterTasks, FailureCode, ListedTask, TaskState

NOW_MS = 1_764_619_564_120


def test_an_expired_failure_is_marked_in_the_table_and_the_json() -> None:
    expired = ListedTask(
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
    found = ClusterTasks(tasks=(expired,), workers=("127.0.0.1:1",))
    console = Console(width=250, record=True)
    console.print(_table(found, NOW_MS, console))
    text = console.export_text()
    assert "FAILED (expired)" in text
    assert "CALL_FAILED: ValueError: boom" in text
    data = listed_dict(expired, NOW_MS)
    assert (data["expired"], data["retryable"]) == (True, False)
