"""The committed betterproto2 code is what the .proto sources generate, and the
.proto files compile with plain protoc for any other toolchain."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc_tools

from blockx_proto import bundlecoordinator_v1, coordinator_v1, syncinvoker_v1, worker_v1

ROOT = Path(__file__).resolve().parents[2]
PROTO_PACKAGE = ROOT / "packages" / "blockx-proto"
COMMITTED = PROTO_PACKAGE / "src" / "blockx_proto" / "_gen"


def _differences(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    found = [f"only in committed: {x}" for x in cmp.left_only]
    found += [f"missing from committed: {x}" for x in cmp.right_only]
    found += [f"differs: {x}" for x in cmp.diff_files]
    for name, sub in cmp.subdirs.items():
        found += [f"{name}/{d}" for d in _differences(a / name, b / name)]
        del sub
    return found


def test_committed_code_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "_gen"
    subprocess.run(
        [sys.executable, str(PROTO_PACKAGE / "scripts" / "generate.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    stale = _differences(COMMITTED, out)
    assert not stale, (
        "blockx_proto._gen is stale; run "
        "`uv run python packages/blockx-proto/scripts/generate.py`: " + ", ".join(stale)
    )


def test_plain_protoc_compiles_every_proto(tmp_path: Path) -> None:
    proto_root = PROTO_PACKAGE / "proto"
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    assert len(files) == 4
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={tmp_path}",
            f"--descriptor_set_out={tmp_path / 'all.pb'}",
            *files,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "worker" / "v1" / "worker_pb2.py").exists()


def test_pinned_service_paths() -> None:
    """The method paths other tools dial must never change."""
    pinned = {
        coordinator_v1.CoordinatorServiceBase: [
            "/coordinator.v1.CoordinatorService/ReserveWorkerSlot",
            "/coordinator.v1.CoordinatorService/ExplainPlacement",
        ],
        bundlecoordinator_v1.BundleCoordinatorServiceBase: [
            "/bundlecoordinator.v1.BundleCoordinatorService/ReserveWorkerSlot",
            "/bundlecoordinator.v1.BundleCoordinatorService/ExplainPlacement",
        ],
        worker_v1.WorkerServiceBase: [
            "/worker.v1.WorkerService/RequestTaskSlot",
            "/worker.v1.WorkerService/SubmitTask",
            "/worker.v1.WorkerService/GetTaskResult",
            "/worker.v1.WorkerService/WatchTasks",
            "/worker.v1.WorkerService/ListTasks",
            "/worker.v1.WorkerService/CancelTask",
            "/worker.v1.WorkerService/DescribeWorker",
            "/worker.v1.WorkerService/GetCallRecord",
        ],
        syncinvoker_v1.SyncInvokerServiceBase: [
            "/syncinvoker.v1.SyncInvokerService/Invoke",
            "/syncinvoker.v1.SyncInvokerService/DebugInvoke",
            "/syncinvoker.v1.SyncInvokerService/Precheck",
        ],
    }
    for base, paths in pinned.items():
        servable: Any = base()  # every generated *ServiceBase has a grpclib __mapping__
        assert sorted(servable.__mapping__()) == sorted(paths)


def test_pinned_field_numbers() -> None:
    """Field names and numbers are the wire contract; renumbering breaks every client."""
    task = worker_v1.TaskInput(
        task_id="t",
        function_call_config=worker_v1.FunctionCallConfig(type="CallListCallConfig", config="{}"),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
        task_timeout_ms=30000,
    )
    assert bytes(task) == (
        b"\n\x01t"
        b"\x12\x18\n\x12CallListCallConfig\x12\x02{}"
        b"\x1a\x1e\n\x18ReturnValueResultHandler\x12\x02{}"
        b" \xb0\xea\x01"
    )
    update = worker_v1.TaskUpdate(
        task_id="t",
        state=worker_v1.TaskState.FAILED,
        is_terminal=True,
        worker_addr="w:1",
        timestamp_ms=5,
        result=worker_v1.TaskResult(
            success=False,
            execute_result=worker_v1.ExecuteResult(
                failure_code="TIMED_OUT", retryable=True, failure_message="late"
            ),
        ),
        error="",
    )
    assert worker_v1.TaskUpdate.parse(bytes(update)) == update
    assert [s.name for s in worker_v1.TaskState] == [
        "UNSPECIFIED",
        "ALLOCATED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
    ]
    assert worker_v1.TaskUpdate().to_dict(include_default_values=True).keys() >= {
        "taskId",
        "state",
        "isTerminal",
        "workerAddr",
        "timestampMs",
        "error",
    }
