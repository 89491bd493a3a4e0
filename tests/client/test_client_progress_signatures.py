"""Client and SyncClient take the same options for the calls that report call
progress (``watch_tasks(progress=...)``, ``run(on_progress=...)``): SyncClient spells
them out for the type checker, so the two lists must stay the same."""

from __future__ import annotations

import inspect

import pytest

from blockx_client import CallProgress, Client, ListedTask, SyncClient, TaskState


@pytest.mark.parametrize("method", ["watch_tasks", "run"])
def test_sync_client_methods_take_what_client_methods_take(method: str) -> None:
    options = inspect.signature(getattr(Client, method)).parameters
    sync_options = inspect.signature(getattr(SyncClient, method)).parameters
    assert list(sync_options) == list(options)
    for name, param in options.items():
        assert (sync_options[name].kind, sync_options[name].default) == (
            param.kind,
            param.default,
        ), name


def test_progress_options_are_opt_in() -> None:
    assert inspect.signature(Client.watch_tasks).parameters["progress"].default is False
    assert inspect.signature(Client.run).parameters["on_progress"].default is None


@pytest.mark.parametrize(
    ("progress", "shown"),
    [
        (CallProgress(calls_done=40, calls_total=100, total_known=True), "40/100"),
        (CallProgress(calls_done=40, calls_total=60, total_known=False), "40/60 so far"),
        (CallProgress(), "0/0 so far"),
    ],
)
def test_call_progress_shown(progress: CallProgress, shown: str) -> None:
    assert progress.shown() == shown


def test_listed_task_progress() -> None:
    none = ListedTask(task_id="t", state=TaskState.ALLOCATED, worker_addr="w")
    assert none.progress is None
    running = ListedTask(
        task_id="t",
        state=TaskState.RUNNING,
        worker_addr="w",
        calls_done=3,
        calls_total=9,
        calls_total_known=True,
    )
    assert running.progress == CallProgress(calls_done=3, calls_total=9, total_known=True)
