"""Cluster-wide tasks with real processes: two ``blockx-worker`` processes registered
in a real etcd, tasks on each, and ``blockx`` run as a subprocess.

``blockx tasks`` lists both Workers' tasks (and filters them); ``get-result``,
``watch`` and ``cancel`` without ``--worker`` find the Worker that holds a task;
``watch --json`` prints each update as a line as it happens; a failed task shows
every failed call; a Worker killed without deregistering is reported as not
answering, last, because it ends the cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from grpclib.client import Channel
from processes import EXAMPLES, WorkerProcess, call_list_task, execute_result, run_to_end
from support import wait_until

from blockx_client import list_workers
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The block cluster's registry prefix, which the CLI looks in by default; the etcd
# is this module's own, so no other test's workers are in it.
PREFIX = "/blockx/workers/"

FUNCTIONS = '''
import time

from blockx_executor import call


def echo(x):
    return x


def boom(x):
    raise ValueError(f"boom {x}")


def sleepy(seconds):
    time.sleep(seconds)


async def several_failures(n):
    """Calls boom n times, shrugging off each failure, then fails itself."""
    for i in range(n):
        try:
            await call("boom", i)
        except Exception:
            pass
    raise RuntimeError(f"gave up after {n} failed sub-calls")
'''


@dataclass
class Cluster:
    etcd: EtcdServer
    a: WorkerProcess
    b: WorkerProcess
    stub_a: worker_v1.WorkerServiceStub
    stub_b: worker_v1.WorkerServiceStub

    def env(self) -> dict[str, str]:
        return {**os.environ, "ETCD_ENDPOINTS": self.etcd.endpoint, "COLUMNS": "250"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    base = tmp_path_factory.mktemp("cluster-tasks")
    functions = base / "functions"
    functions.mkdir()
    shutil.copy(EXAMPLES / "functions" / "hello.py", functions / "hello.py")
    (functions / "testfns.py").write_text(FUNCTIONS)
    channels: list[Channel] = []
    async with EtcdServer() as etcd:
        workers = [
            WorkerProcess(
                {
                    "ETCD_ENDPOINTS": etcd.endpoint,
                    "WORKER_REGISTRY_PREFIX": PREFIX,
                    "WORKER_HEARTBEAT_INTERVAL": "100",
                    "FUNCTIONS_DIR": str(functions),
                    # A killed worker stays registered this long: the last test needs it.
                    "WORKER_LEASE_TTL_S": "120",
                },
                base / f"worker-{name}.log",
            )
            for name in ("a", "b")
        ]
        try:
            for worker in workers:
                await worker.wait_ready()

            async def both_registered() -> bool:
                found = await list_workers([etcd.endpoint], [PREFIX])
                return {w.heartbeat.worker_addr for w in found} == {w.addr for w in workers}

            await wait_until(both_registered, "both workers registered", timeout=30)
            channels = [w.channel() for w in workers]
            stubs = [worker_v1.WorkerServiceStub(c) for c in channels]
            yield Cluster(etcd, workers[0], workers[1], stubs[0], stubs[1])
        finally:
            for channel in channels:
                channel.close()
            for worker in workers:
                worker.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seeded(cluster: Cluster) -> Cluster:
    """a-ok and a-fail on worker a; b-ok on worker b, and b-held only reserved there."""
    update = await run_to_end(cluster.stub_a, call_list_task("a-ok", "echo", [[1]]))
    assert update.state == worker_v1.TaskState.SUCCEEDED
    update = await run_to_end(cluster.stub_a, call_list_task("a-fail", "several_failures", [[3]]))
    assert execute_result(update).failure_code == "CALL_FAILED"
    update = await run_to_end(cluster.stub_b, call_list_task("b-ok", "echo", [[2]]))
    assert update.state == worker_v1.TaskState.SUCCEEDED
    await cluster.stub_b.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="b-held", ttl_ms=60_000)
    )
    return cluster


def blockx(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx")
    assert binary is not None
    result = subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster.env(),
    )
    # A CLI crash; the tracebacks of user functions in failure messages are on stdout.
    assert "Traceback" not in result.stderr, result.stderr
    return result


def listed(cluster: Cluster, *flags: str) -> dict[str, Any]:
    # Each worker gets 30 s to answer (5 by default): a loaded machine must not make
    # a live worker look unreachable. The dead worker's test passes its own.
    result = blockx(cluster, "tasks", "--json", "--timeout", "30", *flags)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def by_id(data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {t["task_id"]: (t["state"], t["worker_addr"]) for t in data["tasks"]}


async def test_tasks_lists_the_tasks_of_every_worker(seeded: Cluster) -> None:
    a, b = seeded.a.addr, seeded.b.addr
    data = listed(seeded)
    assert by_id(data) == {
        "a-ok": ("SUCCEEDED", a),
        "a-fail": ("FAILED", a),
        "b-ok": ("SUCCEEDED", b),
        "b-held": ("ALLOCATED", b),
    }
    assert sorted(data["workers"]) == sorted([a, b])
    assert data["unreachable"] == []
    failed = next(t for t in data["tasks"] if t["task_id"] == "a-fail")
    assert failed["function"] == "several_failures"
    assert failed["failure_code"] == "CALL_FAILED"
    assert "gave up after 3 failed sub-calls" in failed["failure_summary"]
    assert failed["call_failures"] == 4
    assert failed["converged_ms"] >= failed["created_ms"] > 0
    # The table shows the same, with both workers.
    table = blockx(seeded, "tasks", "--timeout", "30")
    assert table.returncode == 0, table.stderr
    for text in ("a-ok", "a-fail", "b-ok", "b-held", a, b, "4 task(s) on 2 worker(s)"):
        assert text in table.stdout, table.stdout


FILTERS = [
    (["--state", "failed"], {"a-fail"}),
    (["--state", "SUCCEEDED", "--state", "ALLOCATED"], {"a-ok", "b-ok", "b-held"}),
    (["--function", "echo"], {"a-ok", "b-ok"}),
    (["--newer-than", "1h"], {"a-ok", "a-fail", "b-ok", "b-held"}),
    (["--older-than", "1h"], set()),
]


@pytest.mark.parametrize(("flags", "expected"), FILTERS)
async def test_tasks_filters(seeded: Cluster, flags: list[str], expected: set[str]) -> None:
    assert set(by_id(listed(seeded, *flags))) == expected


async def test_bad_filters_are_usage_errors(seeded: Cluster) -> None:
    for flags, says in (
        (["--state", "DONE"], "--state 'DONE'"),
        (["--older-than", "soon"], "is not a duration"),
        (["--older-than", "2h", "--newer-than", "1h"], "no task can be both"),
    ):
        result = blockx(seeded, "tasks", *flags)
        assert result.returncode == 2, result.stdout
        assert says in result.stderr


async def test_get_result_finds_the_worker_and_shows_every_failed_call(seeded: Cluster) -> None:
    result = blockx(seeded, "get-result", "b-ok", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["state"], data["worker_addr"]) == ("SUCCEEDED", seeded.b.addr)

    result = blockx(seeded, "get-result", "a-fail", "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["worker_addr"] == seeded.a.addr
    failures = [(f["root_index"], f["function"], f["kind"]) for f in data["call_failures"]]
    assert failures == [(-1, "boom", "USER_ERROR")] * 3 + [(0, "several_failures", "USER_ERROR")]
    assert [f["message"].split("\n")[0] for f in data["call_failures"][:3]] == [
        f"ValueError: boom {i}" for i in range(3)
    ]
    assert data["call_failures_omitted"] == 0

    shown = blockx(seeded, "get-result", "a-fail")
    assert "failed calls (4):" in shown.stdout, shown.stdout
    for i in range(3):
        assert f"sub-call boom (attempt 1): USER_ERROR: ValueError: boom {i}" in shown.stdout


async def test_get_result_says_when_no_worker_knows_the_task(seeded: Cluster) -> None:
    result = blockx(seeded, "get-result", "nobody-has-this")
    assert result.returncode == 1
    assert "no registered worker knows task nobody-has-this (asked 2)" in result.stderr


async def test_watch_json_prints_each_update_as_it_happens(seeded: Cluster) -> None:
    """The watch finds b-held on worker b and prints its snapshot (ALLOCATED) while
    the task has not even been submitted; the terminal line comes after it ran."""
    binary = shutil.which("blockx")
    assert binary is not None
    proc = await asyncio.create_subprocess_exec(
        binary,
        "watch",
        "b-held",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=seeded.env(),
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
        if not line:  # it ended without a word on stdout: say why
            assert proc.stderr is not None
            pytest.fail((await proc.stderr.read()).decode())
        first = json.loads(line)
        assert proc.returncode is None  # still watching: the line came before the end
        assert (first["task_id"], first["state"], first["is_terminal"]) == (
            "b-held",
            "ALLOCATED",
            False,
        )
        assert first["worker_addr"] == seeded.b.addr
        slot = await seeded.stub_b.request_task_slot(
            worker_v1.RequestTaskSlotRequest(task_id="b-held", ttl_ms=60_000)
        )
        await seeded.stub_b.submit_task(
            worker_v1.SubmitTaskRequest(
                task=call_list_task("b-held", "echo", [[3]]), slot_id=slot.slot_id
            )
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert await proc.wait() == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert len(lines) == 1, out
    last = lines[0]
    assert (last["state"], last["is_terminal"]) == ("SUCCEEDED", True)
    assert last["result"]["plugin_results"][0]["result"] == [3]


async def test_watch_without_worker_follows_tasks_on_both_workers(seeded: Cluster) -> None:
    result = blockx(seeded, "watch", "a-ok", "b-ok", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {(u["task_id"], u["worker_addr"], u["state"]) for u in lines} == {
        ("a-ok", seeded.a.addr, "SUCCEEDED"),
        ("b-ok", seeded.b.addr, "SUCCEEDED"),
    }
    unknown = blockx(seeded, "watch", "a-ok", "nobody-has-this")
    assert unknown.returncode == 1
    assert "no registered worker knows task nobody-has-this" in unknown.stderr


async def test_a_task_id_on_two_workers_asks_for_worker(seeded: Cluster) -> None:
    await run_to_end(seeded.stub_a, call_list_task("twice", "echo", [[1]]))
    await run_to_end(seeded.stub_b, call_list_task("twice", "echo", [[1]]))
    result = blockx(seeded, "get-result", "twice")
    assert result.returncode == 2
    assert "is known to 2 workers" in result.stderr
    assert "--worker" in result.stderr
    pinned = blockx(seeded, "get-result", "twice", "--worker", seeded.b.addr, "--json")
    assert json.loads(pinned.stdout)["worker_addr"] == seeded.b.addr


async def test_cancel_finds_the_worker_and_says_what_it_did(seeded: Cluster) -> None:
    b = seeded.b.addr
    await seeded.stub_b.submit_task(
        worker_v1.SubmitTaskRequest(task=call_list_task("b-sleeps", "sleepy", [[600]]))
    )
    result = blockx(seeded, "cancel", "b-sleeps")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"task b-sleeps on {b}: cancelled (FAILED CANCELLED: cancelled by a client)\n"
    )
    # Twice is the same as once; its result says it is not to be retried.
    again = blockx(seeded, "cancel", "b-sleeps", "--json")
    assert again.returncode == 0, again.stderr
    data = json.loads(again.stdout)
    assert (data["outcome"], data["state"], data["worker_addr"]) == ("CANCELLED", "FAILED", b)
    assert (data["result"]["failure_code"], data["result"]["retryable"]) == ("CANCELLED", False)
    # Only reserved: nothing runs to cancel, and it says so.
    await seeded.stub_a.request_task_slot(
        worker_v1.RequestTaskSlotRequest(task_id="a-reserved", ttl_ms=60_000)
    )
    reserved = blockx(seeded, "cancel", "a-reserved")
    assert reserved.returncode == 1, reserved.stderr
    assert f"task a-reserved on {seeded.a.addr}: not cancelled: reserved, not submitted" in (
        reserved.stdout
    )
    assert "its slot frees itself when its lease ends" in reserved.stdout


async def test_a_dead_worker_is_reported_not_fatal(seeded: Cluster) -> None:
    """Last: it kills worker b, whose heartbeat stays registered until its lease ends."""
    seeded.b.kill()
    data = listed(seeded)  # a killed worker refuses the connection at once
    assert [u["worker_addr"] for u in data["unreachable"]] == [seeded.b.addr]
    assert {t for t, (_, addr) in by_id(data).items() if addr == seeded.a.addr} >= {
        "a-ok",
        "a-fail",
    }
    table = blockx(seeded, "tasks", "--timeout", "30")
    assert table.returncode == 0
    assert f"worker {seeded.b.addr} did not answer" in table.stdout
    missing = blockx(seeded, "get-result", "b-ok")
    assert missing.returncode == 1
    assert f"1 did not answer and may hold it: {seeded.b.addr}" in missing.stderr
