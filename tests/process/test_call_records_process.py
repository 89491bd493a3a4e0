"""A real ``blockx-worker`` keeps the record of the call that failed a task, and
GetCallRecord (and ``Client.call_record``) hands it out: its arguments, the code of
its epoch, every IO request with its answer (a sub-call's included) and the same
exception text and line the task failed with. A task that succeeded, a call that did
not fail and a task no longer retained have none, each NOT_FOUND saying why."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from processes import WorkerProcess, call_list_task, execute_result, run_to_end
from support import wait_until

from blockx_client import Client, SyncClient, TaskNotFoundError
from blockx_core.call_record import RecordedIo, decode_record
from blockx_core.failures import CallFailureKind
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

FUNCTIONS = """
from blockx_executor import call, io


async def lookup(key):
    return await io.memory.get(key)


async def fails_on(x):
    value = await io.memory.get("answer")
    sub = await call("lookup", "n1")
    if x == 3:
        raise ValueError(f"bad {x}: {value + sub}")
    return x


async def reads_all(prefix):
    keys = await io.memory.keys(prefix)
    raise RuntimeError(f"read {len(keys)} keys")
"""

SEED = {"answer": 42, "n1": 1, **{f"k{i:04d}": i for i in range(500)}}
RAISE_LINE = FUNCTIONS.splitlines().index('        raise ValueError(f"bad {x}: {value + sub}")') + 1


@dataclass
class Workers:
    kept: WorkerProcess  # RESULT_RETENTION_MS default; records up to 2,000 bytes
    brief: WorkerProcess  # results kept 200 ms


def _worker(etcd: EtcdServer, base: Path, name: str, **env: str) -> WorkerProcess:
    return WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": f"/blockx/test/lanes/records-{name}/workers/",
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(base / "functions"),
            "IO_MEMORY_SEED_FILE": str(base / "seed.json"),
            "EXECUTOR_COUNT": "2",
            **env,
        },
        base / f"{name}.log",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Workers]:
    base = tmp_path_factory.mktemp("call-records")
    (base / "functions").mkdir()
    (base / "functions" / "recfns.py").write_text(FUNCTIONS)
    (base / "seed.json").write_text(json.dumps(SEED))
    async with EtcdServer() as etcd:
        kept = _worker(etcd, base, "kept", CALL_RECORD_MAX_BYTES="2000")
        brief = _worker(etcd, base, "brief", RESULT_RETENTION_MS="200")
        try:
            await kept.wait_ready()
            await brief.wait_ready()
            yield Workers(kept, brief)
        finally:
            assert kept.stop() == 0
            assert brief.stop() == 0
            assert "Traceback" not in kept.output()


@asynccontextmanager
async def stub_of(worker: WorkerProcess) -> AsyncIterator[worker_v1.WorkerServiceStub]:
    channel = worker.channel()
    try:
        yield worker_v1.WorkerServiceStub(channel)
    finally:
        channel.close()


def _gauge(page: list[str], name: str) -> float:
    [value] = [line.split(" ")[1] for line in page if line.startswith(f"{name} ")]
    return float(value)


async def _not_found(
    stub: worker_v1.WorkerServiceStub, request: worker_v1.GetCallRecordRequest
) -> str:
    with pytest.raises(GRPCError) as refused:
        await stub.get_call_record(request)
    assert refused.value.status is Status.NOT_FOUND
    assert refused.value.message is not None
    return refused.value.message


async def test_a_failed_call_s_record_has_its_io_and_its_exception(workers: Workers) -> None:
    async with stub_of(workers.kept) as stub:
        final = await run_to_end(stub, call_list_task("rec-fail", "fails_on", [[1], [2], [3]]))
        failed = execute_result(final)
        assert failed.failure_code == "CALL_FAILED"
        answer = await stub.get_call_record(worker_v1.GetCallRecordRequest(task_id="rec-fail"))
        assert answer.call_index == 2
        record = decode_record(answer.record)
        assert (record.function, record.args) == ("fails_on", [3])
        assert record.io == [
            RecordedIo(backend="memory", op="get", args=["answer"], answer=42),
            RecordedIo(backend="memory", op="get", args=["n1"], answer=1),
        ]
        assert record.failure is not None
        assert record.failure.kind is CallFailureKind.USER_ERROR
        assert "ValueError: bad 3: 43" in record.failure.message
        assert f'recfns.py", line {RAISE_LINE}, in fails_on' in record.failure.message
        # The exception text is the one the task failed with.
        assert record.failure.message[:200] in failed.failure_message
        assert record.code == {"recfns": FUNCTIONS}
        assert record.code_epoch >= 1
        assert record.result is None

        page = workers.kept.metrics().splitlines()
        assert _gauge(page, "blockx_worker_call_records") >= 1
        assert _gauge(page, "blockx_worker_call_record_bytes") >= len(answer.record)

        same = await stub.get_call_record(
            worker_v1.GetCallRecordRequest(task_id="rec-fail", call_index=2)
        )
        assert same.record == answer.record
        message = await _not_found(
            stub, worker_v1.GetCallRecordRequest(task_id="rec-fail", call_index=0)
        )
        assert message == (
            "call 0 of task 'rec-fail' did not fail it: only failed calls are recorded "
            "(the failed call: 2)"
        )


async def test_a_record_stops_at_call_record_max_bytes(workers: Workers) -> None:
    async with stub_of(workers.kept) as stub:
        final = await run_to_end(stub, call_list_task("rec-big", "reads_all", [["k"]]))
        assert execute_result(final).failure_code == "CALL_FAILED"
        answer = await stub.get_call_record(worker_v1.GetCallRecordRequest(task_id="rec-big"))
        record = decode_record(answer.record)
        # 500 keys are more than CALL_RECORD_MAX_BYTES=2000: the answer is left out.
        assert record.truncated
        assert record.io == []
        assert record.failure is not None
        assert "RuntimeError: read 500 keys" in record.failure.message


async def test_no_record_for_a_task_that_succeeded_or_is_unknown(workers: Workers) -> None:
    async with stub_of(workers.kept) as stub:
        final = await run_to_end(stub, call_list_task("rec-ok", "fails_on", [[1]]))
        assert final.state == worker_v1.TaskState.SUCCEEDED
        message = await _not_found(stub, worker_v1.GetCallRecordRequest(task_id="rec-ok"))
        assert message == "task 'rec-ok' succeeded: only the calls that fail a task are recorded"
        final = await run_to_end(stub, call_list_task("rec-missing", "no_such_function", [[1]]))
        assert execute_result(final).failure_code == "CALL_FAILED"
        message = await _not_found(stub, worker_v1.GetCallRecordRequest(task_id="rec-missing"))
        assert message.startswith(
            "no call record is kept for task 'rec-missing': no call of it ran and failed it"
        )
        message = await _not_found(stub, worker_v1.GetCallRecordRequest(task_id="rec-never"))
        assert message.startswith("task 'rec-never' is unknown here, or its result has expired")
        assert "results are kept" in message
        with pytest.raises(GRPCError) as refused:
            await stub.get_call_record(
                worker_v1.GetCallRecordRequest(task_id="rec-fail", call_index=-1)
            )
        assert refused.value.status is Status.INVALID_ARGUMENT


async def test_the_client_reads_a_record_and_a_missing_one(workers: Workers) -> None:
    addr = f"{workers.kept.host}:{workers.kept.port}"
    async with stub_of(workers.kept) as stub:
        await run_to_end(stub, call_list_task("rec-client", "fails_on", [[3]]))
    async with Client(direct=True) as client:
        record = await client.call_record("rec-client", worker_addr=addr)
        assert (record.function, record.args, len(record.io)) == ("fails_on", [3], 2)
        with pytest.raises(TaskNotFoundError, match="'rec-ok' succeeded"):
            await client.call_record("rec-ok", worker_addr=addr)
        with pytest.raises(TaskNotFoundError, match="call 5 of task 'rec-client' did not fail"):
            await client.call_record("rec-client", 5, worker_addr=addr)
    # The Worker is another process: the sync client's blocking call holds up nothing.
    with SyncClient(direct=True) as sync:
        assert sync.call_record("rec-client", 0, worker_addr=addr) == record


async def test_a_record_goes_with_its_task_s_result(workers: Workers) -> None:
    async with stub_of(workers.brief) as stub:
        final = await run_to_end(stub, call_list_task("rec-brief", "fails_on", [[3]]))
        assert execute_result(final).failure_code == "CALL_FAILED"

        async def expired() -> bool:
            try:
                await stub.get_task_result(worker_v1.GetTaskResultRequest(task_id="rec-brief"))
            except GRPCError as exc:
                return exc.status == Status.NOT_FOUND
            return False

        await wait_until(expired, "the result expired", timeout=30)
        message = await _not_found(stub, worker_v1.GetCallRecordRequest(task_id="rec-brief"))
        assert "results are kept 200 ms" in message
