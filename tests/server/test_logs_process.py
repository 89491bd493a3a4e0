"""Structured logs: real ``blockx-worker`` and ``blockx-coordinator`` processes with
``BLOCKX_LOG_FORMAT=json`` write nothing but JSON lines, and a task's lifecycle
events carry its fields; the formats and the wire loggers in-process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from processes import CoordinatorProcess, SyncInvokerProcess, WorkerProcess
from support import wait_until

from blockx_proto import syncinvoker_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.logs import LogFormat, LogSettings, configure_logging, log_event

FUNCTIONS = """
def echo(x):
    return x

def boom(x):
    raise ValueError(f"boom {x}")
"""


def task(task_id: str, function: str) -> worker_v1.TaskInput:
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig",
            config=json.dumps({"function": function, "callList": [[1], [2]]}),
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (a line that is not one fails the test)."""
    entries = []
    for line in text.splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict), line
        for key in ("ts", "level", "logger", "message"):
            assert key in entry, line
        entries.append(entry)
    return entries


async def test_every_line_is_json_and_the_lifecycle_events_carry_the_task_fields(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "fns.py").write_text(FUNCTIONS)
    prefix = unique_lane()
    logs = {"BLOCKX_LOG_FORMAT": "json", "BLOCKX_LOG_LEVEL": "DEBUG"}
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
            "RESULT_RETENTION_MS": "1500",
            **logs,
        },
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd_server.endpoint, "COORDINATOR_REGISTRY_PREFIXES": prefix, **logs},
        tmp_path / "coordinator.log",
    )
    try:
        await worker.wait_ready()
        await coordinator.wait_serving()

        async def routed() -> bool:
            return await coordinator.status_of("t-ok") is Status.OK

        await wait_until(routed, "the coordinator routing to the worker", timeout=20)
        reservation = await coordinator.reserve("t-ok")
        channel = worker.channel()
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            await stub.submit_task(
                worker_v1.SubmitTaskRequest(task=task("t-ok", "echo"), slot_id=reservation.slot_id)
            )
            await stub.submit_task(worker_v1.SubmitTaskRequest(task=task("t-fail", "boom")))
            async with asyncio.timeout(30):
                updates = [
                    u
                    async for u in stub.watch_tasks(
                        worker_v1.WatchTasksRequest(task_ids=["t-ok", "t-fail"])
                    )
                ]
            assert {u.task_id: u.state for u in updates if u.is_terminal} == {
                "t-ok": worker_v1.TaskState.SUCCEEDED,
                "t-fail": worker_v1.TaskState.FAILED,
            }

            async def purged() -> bool:
                return any(
                    e.get("event") == "purged" and e["task_id"] == "t-fail"
                    for e in json_lines(worker.output())
                )

            await wait_until(purged, "the retained results to be purged", timeout=20)
        finally:
            channel.close()
    finally:
        assert worker.stop() == 0
        assert coordinator.stop() == 0

    worker_entries = json_lines(worker.output())
    coordinator_entries = json_lines(coordinator.output())
    assert any("serving" in e["message"] for e in coordinator_entries)
    # No HTTP/2 frame dumps at DEBUG unless BLOCKX_LOG_WIRE asks for them.
    for entry in worker_entries + coordinator_entries:
        assert entry["logger"].split(".")[0] not in ("h2", "hpack"), entry

    def events(task_id: str) -> list[dict[str, Any]]:
        return [e for e in worker_entries if e.get("task_id") == task_id and "event" in e]

    ok = events("t-ok")
    # Reserved more than once: while waiting for the route, then the idempotent
    # reserve (and again when a loaded host makes a RequestTaskSlot time out).
    while ok[1]["event"] == "reserved":
        ok = ok[1:]
    assert [(e["event"], e.get("phase")) for e in ok] == [
        ("reserved", None),
        ("submitted", None),
        ("phase_started", "BUILDER"),
        ("phase_finished", "BUILDER"),
        ("phase_started", "CALLS"),
        ("phase_finished", "CALLS"),
        ("phase_started", "WRITER"),
        ("phase_finished", "WRITER"),
        ("converged", None),
        ("purged", None),
    ]
    for entry in ok:
        assert entry["worker"] == worker.addr
        assert {"function", "code_epoch"} <= entry.keys()
    by_event = {(e["event"], e.get("phase")): e for e in ok}
    assert by_event[("reserved", None)]["slot_id"] == reservation.slot_id
    assert by_event[("submitted", None)]["builder"] == "CallListCallConfig"
    converged = by_event[("converged", None)]
    assert converged["function"] == "echo"
    assert converged["code_epoch"] == 1
    assert converged["state"] == "SUCCEEDED"
    assert converged["failure_code"] is None
    assert by_event[("phase_finished", "CALLS")]["function"] == "echo"
    assert by_event[("phase_finished", "BUILDER")]["call_count"] == 2

    failed = {(e["event"], e.get("phase")): e for e in events("t-fail")}
    calls = failed[("phase_finished", "CALLS")]
    assert calls["level"] == "WARNING"
    assert calls["success"] is False
    assert calls["failure_code"] == "CALL_FAILED"
    assert calls["call_index"] in (0, 1)  # whichever of the two failed first
    assert calls["call_failure_kind"] == "USER_ERROR"
    end = failed[("converged", None)]
    assert end["state"] == "FAILED"
    assert end["failure_code"] == "CALL_FAILED"
    assert end["function"] == "boom"
    assert f"boom {calls['call_index'] + 1}" in end["failure_message"]
    assert ("purged", None) in failed


async def test_the_sync_invoker_logs_each_invoke_with_its_call_id(tmp_path: Path) -> None:
    invoker = SyncInvokerProcess(
        {"BLOCKX_LOG_FORMAT": "json", "BLOCKX_LOG_LEVEL": "DEBUG"}, tmp_path / "invoker.log"
    )
    try:
        await invoker.wait_ready()
        channel = invoker.channel()
        try:
            stub = syncinvoker_v1.SyncInvokerServiceStub(channel)
            answer = await stub.invoke(
                syncinvoker_v1.InvokeRequest(function="hello_world", args='["x"]', call_id="c-7"),
                timeout=10,
            )
            assert answer.success, answer.failure_message
        finally:
            channel.close()
    finally:
        assert invoker.stop() == 0
    invoked = [e for e in json_lines(invoker.output()) if e.get("event") == "invoked"]
    assert len(invoked) == 1
    assert invoked[0]["call_id"] == "c-7"
    assert invoked[0]["function"] == "hello_world"
    assert invoked[0]["code_epoch"] == 1
    assert invoked[0]["success"] is True
    assert invoked[0]["rpc"] == "Invoke"


@pytest.mark.parametrize("program", ["blockx-worker", "blockx-coordinator", "blockx-proxy"])
def test_a_bad_log_format_is_one_line_naming_the_variable(program: str, tmp_path: Path) -> None:
    binary = shutil.which(program)
    assert binary is not None
    done = subprocess.run(
        [binary],
        env={**os.environ, "BLOCKX_LOG_FORMAT": "yaml", "BLOCKX_LOG_WIRE": "sometimes"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert f"{program}: invalid configuration: BLOCKX_LOG_FORMAT must be text or json" in (
        lines[0] if len(lines) == 2 else "\n".join(lines)
    )
    assert any("BLOCKX_LOG_WIRE must be true or false" in line for line in lines)
    assert "Traceback" not in done.stderr


def test_help_lists_the_log_settings() -> None:
    binary = shutil.which("blockx-worker")
    assert binary is not None
    done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "BLOCKX_LOG_FORMAT (default: text)" in done.stdout
    assert "BLOCKX_LOG_WIRE (default: false)" in done.stdout


@pytest.fixture
def restore_logging() -> Any:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    wire = {name: logging.getLogger(name).level for name in ("h2", "hpack")}
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in wire.items():
        logging.getLogger(name).setLevel(level)


def test_formats_and_wire_loggers(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("DEBUG", LogSettings(format=LogFormat.TEXT), out)
    log_event(logging.getLogger("blockx.task"), "task t1 converged", {"task_id": "t1", "m": "a b"})
    logging.getLogger("h2.connection").debug("frame")
    logging.getLogger("hpack.hpack").debug("header block")
    text = out.getvalue()
    assert text.rstrip().endswith('blockx.task: task t1 converged task_id=t1 m="a b"'), text
    assert "frame" not in text
    assert "header block" not in text

    out = io.StringIO()
    configure_logging("DEBUG", LogSettings(format=LogFormat.JSON, wire=True), out)
    log_event(logging.getLogger("blockx.task"), "converged", {"task_id": "t1", "n": 2})
    logging.getLogger("h2.connection").debug("frame")
    try:
        raise RuntimeError("broken")
    except RuntimeError:
        logging.getLogger("x").exception("it broke")
    entries = json_lines(out.getvalue())
    assert entries[0]["message"] == "converged"
    assert entries[0]["task_id"] == "t1"
    assert entries[0]["n"] == 2
    assert entries[0]["ts"].endswith("Z")
    assert entries[1]["logger"] == "h2.connection"
    assert "RuntimeError: broken" in entries[2]["exc_info"]
