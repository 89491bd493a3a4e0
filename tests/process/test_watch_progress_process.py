"""Call progress on WatchTasks with a real ``blockx-worker`` process (and a real etcd).

A task of many calls that each sleep a little runs while several Watch streams
follow it: the ones that asked for progress see calls_done rise before the one
terminal update; the one that did not sees exactly the specification's stream, a
snapshot and then the terminal update. ListTasks shows a running task's counts.
The SDK (``watch_tasks(progress=True)``, ``run(on_progress=...)`` on Client and
SyncClient) and the CLI (``watch``, ``watch --json``, ``submit --wait``, ``tasks``)
show them. One Worker serves the whole module.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from grpclib.client import Channel
from processes import WorkerProcess
from support import wait_until

from blockx_client import CallProgress, Client, PluginConfig, SyncClient, Task, TaskUpdate
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

FUNCTIONS = """
import time


def nap(x, seconds):
    time.sleep(seconds)
    return x
"""

CALLS = 40
NAP_S = 0.03  # CALLS naps on two executors: well over the 200 ms between updates


@dataclass
class Served:
    worker: WorkerProcess
    stub: worker_v1.WorkerServiceStub
    etcd: EtcdServer

    def env(self) -> dict[str, str]:
        return {**os.environ, "ETCD_ENDPOINTS": self.etcd.endpoint, "COLUMNS": "250"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    base = tmp_path_factory.mktemp("watch-progress")
    functions = base / "functions"
    functions.mkdir()
    (functions / "naps.py").write_text(FUNCTIONS)
    async with EtcdServer() as etcd:
        worker = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd.endpoint,
                "WORKER_REGISTRY_PREFIX": "/blockx/workers/",
                "FUNCTIONS_DIR": str(functions),
            },
            base / "worker.log",
        )
        channel: Channel | None = None
        try:
            await worker.wait_ready()
            channel = worker.channel()
            yield Served(worker, worker_v1.WorkerServiceStub(channel), etcd)
        finally:
            if channel is not None:
                channel.close()
            worker.stop()
    assert "Traceback" not in worker.output()


def nap_task(task_id: str, calls: int = CALLS, seconds: float = NAP_S) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps(
                {"function": "nap", "callList": [[i, seconds] for i in range(calls)]}
            ),
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


def sdk_nap_task(task_id: str = "", calls: int = CALLS) -> Task:
    return Task(
        task_id=task_id,
        function_call_config=PluginConfig(
            type="CallListCallConfig",
            config={"function": "nap", "callList": [[i, NAP_S] for i in range(calls)]},
        ),
        result_handler=PluginConfig(type="ReturnValueResultHandler"),
    )


async def reserve(stub: worker_v1.WorkerServiceStub, task_id: str) -> str:
    slot = await stub.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id=task_id, ttl_ms=60_000)
    )
    return slot.slot_id


def assert_rising(progresses: Sequence[CallProgress | worker_v1.CallProgress]) -> None:
    done = [p.calls_done for p in progresses]
    assert done == sorted(done), done
    assert all(p.calls_total == CALLS and p.total_known for p in progresses), progresses


# ---- the wire: several watchers on one task -----------------------------------------------


async def test_progress_watchers_see_calls_rise_and_a_plain_watcher_sees_the_spec_stream(
    served: Served,
) -> None:
    stub = served.stub
    task_id = "progress-many-watchers"
    slot_id = await reserve(stub, task_id)
    wants = {"first": True, "plain": False, "second": True}
    seen: dict[str, list[worker_v1.TaskUpdate]] = {name: [] for name in wants}
    opened = {name: asyncio.Event() for name in wants}

    async def follow(name: str) -> None:
        request = worker_v1.WatchTasksRequest(task_ids=[task_id], progress=wants[name])
        async for update in stub.watch_tasks(request):
            seen[name].append(update)
            opened[name].set()

    async with asyncio.timeout(120), asyncio.TaskGroup() as group:
        for name in wants:
            group.create_task(follow(name))
        for event in opened.values():
            await event.wait()  # every stream holds its snapshot: all watch from the start
        await stub.submit_task(worker_v1.SubmitTaskRequest(task=nap_task(task_id), slot_id=slot_id))

    # Without progress: exactly the snapshot, then the one terminal update.
    plain = seen["plain"]
    assert [(u.state, u.is_terminal) for u in plain] == [
        (worker_v1.TaskState.ALLOCATED, False),
        (worker_v1.TaskState.SUCCEEDED, True),
    ], plain
    assert all(u.progress is None for u in plain), plain

    for name in ("first", "second"):
        updates = seen[name]
        snapshot, *between, terminal = updates
        assert (snapshot.state, snapshot.is_terminal) == (worker_v1.TaskState.ALLOCATED, False)
        assert terminal.is_terminal
        assert terminal.state == worker_v1.TaskState.SUCCEEDED
        assert [u for u in updates if u.is_terminal] == [terminal]
        assert between, f"{name}: no progress update before the terminal one"
        for update in between:
            assert update.state == worker_v1.TaskState.RUNNING
            assert not update.is_terminal
            assert update.progress is not None
        progresses = [u.progress for u in between if u.progress is not None]
        assert_rising(progresses)
        # Only on change: never the same counts twice in a row.
        assert all(a != b for a, b in itertools.pairwise(progresses))
        # Calls were seen finishing along the way, not only the start and the end.
        assert any(0 < p.calls_done < CALLS for p in progresses), progresses
        assert terminal.progress is not None
        assert (terminal.progress.calls_done, terminal.progress.calls_total) == (CALLS, CALLS)
        assert terminal.progress.total_known
        assert terminal.progress.calls_failed == 0


async def test_list_tasks_shows_a_running_tasks_calls_and_a_finished_ones_last(
    served: Served,
) -> None:
    stub = served.stub
    task_id = "progress-listed"
    await stub.submit_task(worker_v1.SubmitTaskRequest(task=nap_task(task_id, seconds=0.05)))

    async def listed() -> worker_v1.ListedTask:
        reply = await stub.list_tasks(worker_v1.ListTasksRequest())
        return next(t for t in reply.tasks if t.task_id == task_id)

    async def counting_or_done() -> bool:
        t = await listed()
        return t.calls_done > 0 or t.state == worker_v1.TaskState.SUCCEEDED

    await wait_until(counting_or_done, "the listing counts the task's calls", timeout=60)
    first = await listed()
    if first.state == worker_v1.TaskState.RUNNING:
        assert 0 < first.calls_done <= first.calls_total == CALLS
        assert first.calls_total_known

    async def done() -> bool:
        return (await listed()).state == worker_v1.TaskState.SUCCEEDED

    await wait_until(done, "the task ends", timeout=60)
    last = await listed()
    assert (last.calls_done, last.calls_total, last.calls_total_known) == (CALLS, CALLS, True)

    # blockx tasks: a calls column, and the counts in --json.
    table = blockx(served, "tasks", "--worker", served.worker.addr, "--timeout", "30")
    assert table.returncode == 0, table.stderr
    assert "calls" in table.stdout, table.stdout
    assert f"{CALLS}/{CALLS}" in table.stdout, table.stdout
    as_json = blockx(served, "tasks", "--worker", served.worker.addr, "--json", "--timeout", "30")
    assert as_json.returncode == 0, as_json.stderr
    entry = next(t for t in json.loads(as_json.stdout)["tasks"] if t["task_id"] == task_id)
    assert (entry["calls_done"], entry["calls_total"], entry["calls_total_known"]) == (
        CALLS,
        CALLS,
        True,
    )


# ---- the SDK -----------------------------------------------------------------------------


async def test_client_watch_tasks_with_progress_and_run_on_progress(served: Served) -> None:
    addr = served.worker.addr
    async with Client() as client:
        task_id = "progress-sdk-watch"
        slot_id = await reserve(served.stub, task_id)
        updates: list[TaskUpdate] = []
        plain: list[TaskUpdate] = []
        first = asyncio.Event()

        async def follow(into: list[TaskUpdate], progress: bool) -> None:
            async for update in client.watch_tasks([task_id], worker_addr=addr, progress=progress):
                into.append(update)
                first.set()

        async with asyncio.timeout(120), asyncio.TaskGroup() as group:
            group.create_task(follow(updates, True))
            group.create_task(follow(plain, False))
            await first.wait()
            await served.stub.submit_task(
                worker_v1.SubmitTaskRequest(task=nap_task(task_id), slot_id=slot_id)
            )
        assert [u.is_terminal for u in plain] == [False, True]
        assert all(u.progress is None for u in plain)
        moving = [u for u in updates if not u.is_terminal and u.progress is not None]
        assert moving, updates
        assert_rising([u.progress for u in moving if u.progress is not None])
        final = updates[-1]
        assert final.is_terminal
        assert final.progress is not None
        assert final.progress.shown() == f"{CALLS}/{CALLS}"

        reported: list[CallProgress] = []
        result = await client.run(sdk_nap_task(), worker_addr=addr, on_progress=reported.append)
        assert result.ok, result
        assert reported, "on_progress was never called"
        assert_rising(reported)
        assert any(0 < p.calls_done < CALLS for p in reported), reported
        assert reported[-1].calls_done == CALLS


async def test_sync_client_run_on_progress(served: Served) -> None:
    reported: list[CallProgress] = []

    def run() -> bool:
        with SyncClient() as client:
            result = client.run(
                sdk_nap_task(), worker_addr=served.worker.addr, on_progress=reported.append
            )
        return result.ok

    assert await asyncio.to_thread(run)
    assert reported
    assert reported[-1].calls_done == CALLS
    assert_rising(reported)


# ---- the CLI -----------------------------------------------------------------------------


def blockx(served: Served, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx")
    assert binary is not None
    result = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=timeout, env=served.env()
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


async def test_cli_watch_shows_calls_and_json_prints_progress_lines(served: Served) -> None:
    binary = shutil.which("blockx")
    assert binary is not None
    task_id = "progress-cli-watch"
    slot_id = await reserve(served.stub, task_id)
    addr = served.worker.addr
    as_json = await asyncio.create_subprocess_exec(
        binary,
        "watch",
        task_id,
        "--worker",
        addr,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=served.env(),
    )
    table = await asyncio.create_subprocess_exec(
        binary,
        "watch",
        task_id,
        "--worker",
        addr,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=served.env(),
    )
    assert as_json.stdout is not None
    lines: list[dict[str, Any]] = []
    async with asyncio.timeout(120):
        lines.append(json.loads(await as_json.stdout.readline()))  # the snapshot
        await served.stub.submit_task(
            worker_v1.SubmitTaskRequest(task=nap_task(task_id), slot_id=slot_id)
        )
        rest, json_err = await as_json.communicate()
        table_out, table_err = await table.communicate()
    lines += [json.loads(line) for line in rest.decode().splitlines()]
    assert as_json.returncode == 0, json_err.decode()
    assert lines[0]["state"] == "ALLOCATED"
    assert "progress" not in lines[0]
    moving = [line for line in lines if not line["is_terminal"] and "progress" in line]
    assert moving, lines
    for line in moving:
        assert line["state"] == "RUNNING"
        assert set(line["progress"]) == {
            "calls_done",
            "calls_total",
            "total_known",
            "calls_failed",
        }
    done = [line["progress"]["calls_done"] for line in moving]
    assert done == sorted(done)
    assert lines[-1]["is_terminal"]
    assert lines[-1]["state"] == "SUCCEEDED"
    assert lines[-1]["progress"]["calls_done"] == CALLS
    # The live table ends showing the task's calls.
    assert table.returncode == 0, table_err.decode()
    assert f"calls {CALLS}/{CALLS}" in table_out.decode(), table_out.decode()


async def test_cli_submit_wait_shows_the_calls(served: Served) -> None:
    result = await asyncio.to_thread(
        blockx,
        served,
        "submit",
        "--function",
        "nap",
        *[arg for i in range(CALLS) for arg in ("--call", json.dumps([i, NAP_S]))],
        "--worker",
        served.worker.addr,
        "--wait",
    )
    assert result.returncode == 0, result.stderr
    assert "SUCCEEDED" in result.stdout
    shown = [line for line in result.stderr.splitlines() if ": calls " in line]
    assert shown, result.stderr
    assert shown[-1].endswith(f"calls {CALLS}/{CALLS}"), shown
    assert "calls" not in result.stdout  # stdout keeps only the result, for scripts
