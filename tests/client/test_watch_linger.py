"""A lone task's Watch opens at once even beside a stream that is still closing.

The linger that lets task_ids share a Watch stream applies only while a stream
to the worker still waits for a task. A stream whose tasks have all ended but
which has not yet seen its trailers is closing: a task that comes then must not
wait out the linger (an hour here) for it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from blockx_client import RetryPolicy
from blockx_client._convert import update_from_pb
from blockx_client._options import ClientOptions
from blockx_client._watch import WatchBatcher
from blockx_client.models import TaskState, TaskUpdate
from blockx_proto import worker_v1


class _SlowToCloseWorkers:
    """A WorkerRpc whose Watch streams send every task's terminal update at once,
    then stay open until ``release`` is set, as a stream waiting for its trailers."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.opened: list[list[str]] = []

    async def watch_tasks(self, task_ids: list[str], **_: object) -> AsyncIterator[TaskUpdate]:
        self.opened.append(list(task_ids))
        for task_id in task_ids:
            yield update_from_pb(
                worker_v1.TaskUpdate(
                    task_id=task_id,
                    state=worker_v1.TaskState.SUCCEEDED,
                    is_terminal=True,
                    result=worker_v1.TaskResult(success=True),
                )
            )
        await self.release.wait()


async def test_a_lone_task_beside_a_closing_stream_does_not_wait_for_the_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(WatchBatcher, "LINGER_S", 3600.0)
    workers = _SlowToCloseWorkers()
    options = ClientOptions(
        coordinator="127.0.0.1:1",
        bundle_coordinator=None,
        sync_invoker="127.0.0.1:1",
        retry=RetryPolicy(),
        rpc_timeout_s=30.0,
    )
    batcher = WatchBatcher(workers, options, "127.0.0.1:2", random.Random(1))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(30):
            first = await batcher.wait("t-1")
            second = await batcher.wait("t-2")  # t-1's stream is still open
        assert (first.task_id, first.state) == ("t-1", TaskState.SUCCEEDED)
        assert (second.task_id, second.state) == ("t-2", TaskState.SUCCEEDED)
        assert workers.opened == [["t-1"], ["t-2"]]
    finally:
        workers.release.set()
        await batcher.close()
