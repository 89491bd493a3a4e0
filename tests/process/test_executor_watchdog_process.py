"""The executor watchdog with real Workers, Sync Invokers and executor processes:
the wall-time limit (time.sleep holds an executor), the CPU budget measured by the
Worker from the kernel (user code that replaces the executor's clocks cannot hide
from it), honest durations, executors replaced after EXECUTOR_MAX_CALLS calls or
when their memory stays above EXECUTOR_MAX_RSS_BYTES, and what functions print,
in the Worker's log, tagged and bounded."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import SyncInvokerProcess, WorkerProcess, call_list_task, execute_result, serving
from processes import run_to_end as run_task

from blockx_proto import syncinvoker_v1 as pb
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
import os
import time

_LEAKED = []


def nap(ms):
    time.sleep(ms / 1000)
    return ms


def pid():
    return os.getpid()


def leak():
    # 100 MB that stay in the executor after the call (written, so resident).
    _LEAKED.append(b"x" * (100 * 1024 * 1024))
    return os.getpid()


def _blind_the_executor():
    import blockx_executor.runner as runner

    runner._thread_time_ns = lambda: 0
    time.thread_time_ns = lambda: 0
    time.clock_gettime_ns = lambda clock: 0


def cheat_and_spin():
    _blind_the_executor()
    while True:
        pass


def blind_and_work(n):
    # The executor's own clock cannot be rebound between calls (its code check
    # fails such a call): blind only the standard clocks.
    time.thread_time_ns = lambda: 0
    time.clock_gettime_ns = lambda clock: 0
    total = 0
    for i in range(n):
        total += i * i
    return total


def chatty(word):
    import sys

    print(f"said {word}")
    print(f"warned {word}", file=sys.stderr)
    print("2026-01-01 00:00:00,000 ERROR blockx.task: a forged line\\rX")
    return word


def flood(n):
    for i in range(n):
        print(f"line {i:04d} " + "x" * 40)
    return n


def raw(text):
    os.write(1, (text + "\\n").encode())
    return text
"""

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "functions"
    directory.mkdir()
    (directory / "watchdog.py").write_text(FUNCTIONS)
    return directory


@pytest.fixture
def start_worker(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    functions_dir: Path,
    tmp_path: Path,
) -> Iterator[StartWorker]:
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        worker = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "WORKER_REGISTRY_PREFIX": unique_lane(),
                "WORKER_HEARTBEAT_INTERVAL": "100",
                "FUNCTIONS_DIR": str(functions_dir),
                **env,
            },
            tmp_path / f"worker-{len(started)}.log",
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


async def outcome(
    stub: worker_v1.WorkerServiceStub, task_id: str, function: str, calls: list[list[Any]]
) -> worker_v1.TaskUpdate:
    return await run_task(stub, call_list_task(task_id, function, calls), timeout=120)


def outputs(update: worker_v1.TaskUpdate) -> list[Any]:
    assert update.state is worker_v1.TaskState.SUCCEEDED, update
    values: list[Any] = json.loads(execute_result(update).plugin_results[0].result)
    return values


async def test_sleeping_calls_are_stopped_at_the_wall_limit_and_later_tasks_succeed(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(EXECUTOR_COUNT="2", CALL_WALL_LIMIT_MS="300", TASK_SLOTS="8")
    async with serving(worker) as (stub,):
        # Two calls sleeping 40 s each would hold both executors far past any task.
        naps = await asyncio.gather(
            outcome(stub, "t-nap-1", "nap", [[40_000]]),
            outcome(stub, "t-nap-2", "nap", [[40_000]]),
        )
        for final in naps:
            assert final.state is worker_v1.TaskState.FAILED, final
            failed = execute_result(final)
            assert failed.failure_code == "CALL_FAILED"
            assert "BUDGET_EXCEEDED" in failed.failure_message
            assert "wall time" in failed.failure_message
            assert "CALL_WALL_LIMIT_MS" in failed.failure_message
        # The executors are free again (or replaced): the next tasks run.
        assert outputs(await outcome(stub, "t-after-1", "nap", [[0], [0]])) == [0, 0]
        assert outputs(await outcome(stub, "t-after-2", "nap", [[0]])) == [0]


async def test_a_call_that_blinds_the_executors_clocks_is_stopped_by_the_cpu_budget(
    start_worker: StartWorker,
) -> None:
    # The wall limit is far away: only the CPU budget, measured by the Worker, stops it.
    worker = start_worker(EXECUTOR_COUNT="1", CALL_DEADLINE_MS="300", CALL_WALL_LIMIT_MS="600000")
    async with serving(worker) as (stub,):
        final = await outcome(stub, "t-cheat", "cheat_and_spin", [[]])
        assert final.state is worker_v1.TaskState.FAILED, final
        failed = execute_result(final)
        assert "BUDGET_EXCEEDED" in failed.failure_message
        assert "CPU" in failed.failure_message
        assert outputs(await outcome(stub, "t-next", "nap", [[0]])) == [0]


async def test_executors_are_replaced_after_executor_max_calls_with_no_call_failed(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(EXECUTOR_COUNT="1", EXECUTOR_MAX_CALLS="3")
    async with serving(worker) as (stub,):
        pids = [outputs(await outcome(stub, f"t-pid-{i}", "pid", [[]]))[0] for i in range(4)]
        assert pids[0] == pids[1] == pids[2]
        assert pids[3] != pids[0]
        # One task of many calls crosses several executors and loses none.
        many = outputs(await outcome(stub, "t-many", "pid", [[]] * 10))
        assert len(many) == 10
        assert len(set(many)) >= 3


async def test_an_executor_that_keeps_a_leak_is_replaced_and_later_tasks_succeed(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(EXECUTOR_COUNT="1", EXECUTOR_MAX_RSS_BYTES=str(150 * 1024 * 1024))
    async with serving(worker) as (stub,):
        pids: list[int] = []
        # Each call keeps 100 MB: within a few calls the executor is over 150 MB
        # between calls and is replaced.
        for i in range(12):
            pids += outputs(await outcome(stub, f"t-leak-{i}", "leak", [[]]))
            if len(set(pids)) > 1:
                break
        assert len(set(pids)) > 1, pids
        assert outputs(await outcome(stub, "t-after-leak", "pid", [[]]))


@pytest.mark.parametrize(
    "variable", ["CALL_WALL_LIMIT_MS", "EXECUTOR_MAX_CALLS", "EXECUTOR_MAX_RSS_BYTES"]
)
def test_a_bad_watchdog_setting_refuses_start_up_in_one_line(
    variable: str, functions_dir: Path
) -> None:
    binary = shutil.which("blockx-worker")
    assert binary is not None
    env = {**os.environ, "FUNCTIONS_DIR": str(functions_dir), variable: "0"}
    result = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]


@pytest.fixture
def invoker(functions_dir: Path, tmp_path: Path) -> Iterator[SyncInvokerProcess]:
    process = SyncInvokerProcess(
        {"FUNCTIONS_DIR": str(functions_dir), "EXECUTOR_COUNT": "1"},
        tmp_path / "syncinvoker.log",
    )
    yield process
    process.stop()


async def test_durations_are_measured_by_the_worker(invoker: SyncInvokerProcess) -> None:
    await invoker.wait_ready()
    channel = invoker.channel()
    try:
        stub = pb.SyncInvokerServiceStub(channel)
        nap = await stub.invoke(pb.InvokeRequest(function="nap", args="[2000]"), timeout=60)
        assert nap.success, nap
        assert nap.durations is not None
        # The 2 s the call slept held its executor: it was not waiting in a queue.
        assert nap.durations.queue_us < 2_000_000
        work = await stub.invoke(
            pb.InvokeRequest(function="blind_and_work", args="[3000000]"), timeout=60
        )
        assert work.success, work
        assert work.durations is not None
        # The clocks a function can reach read 0 for this call; the Worker's measure
        # does not.
        assert work.durations.cpu_us > 0
    finally:
        channel.close()


async def test_functions_print_into_the_workers_log_tagged_and_bounded(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    # The Worker's log is already past the executors' RLIMIT_FSIZE: a print that
    # wrote to it would fail with "File too large".
    (tmp_path / "worker-0.log").write_bytes(b"." * 8192 + b"\n")
    worker = start_worker(
        EXECUTOR_COUNT="1", EXECUTOR_MAX_FILE_BYTES="4096", CALL_MAX_LOG_BYTES="2000"
    )
    async with serving(worker) as (stub,):
        assert outputs(await outcome(stub, "t-chatty", "chatty", [["hello"]])) == ["hello"]
        assert outputs(await outcome(stub, "t-flood", "flood", [[1000]])) == [1000]
        assert outputs(await outcome(stub, "t-raw", "raw", [["to fd 1"]])) == ["to fd 1"]
    log = worker.output()
    tag = r"INFO blockx\.output: task t-chatty call \d+: "
    assert re.search(tag + "said hello$", log, re.MULTILINE), log
    assert re.search(tag + "warned hello$", log, re.MULTILINE), log
    # A printed line never stands as a line of the Worker's own.
    assert re.search(
        tag + r"2026-01-01 00:00:00,000 ERROR blockx\.task: a forged line\\x0dX$", log, re.MULTILINE
    )
    assert not re.search("^2026-01-01", log, re.MULTILINE)
    # 1000 lines of 51 bytes: the first 2000 bytes are logged, one note counts the rest.
    kept = re.findall(r"task t-flood call \d+: line \d{4} x+$", log, re.MULTILINE)
    assert 35 <= len(kept) <= 40
    note = re.search(
        r"WARNING blockx\.output: task t-flood call \d+: (\d+) more bytes of output dropped "
        r"\(over CALL_MAX_LOG_BYTES, 2000\)",
        log,
    )
    assert note is not None, log
    assert 1000 * 51 - 2000 <= int(note[1]) < 1000 * 51
    assert len(re.findall("more bytes of output dropped", log)) == 1
    # Bytes written to the file descriptor itself come through the pipe.
    assert re.search(r"(task t-raw call \d+|executor x0\.\d+): to fd 1$", log, re.MULTILINE)
