"""CancelTask at every phase, against a real ``blockx-worker`` (its executors, a
PostgreSQL block database and sink) through a real ``blockx-proxy``, with the SDK.

Each phase is held by a real wait, not a timer: the Builder's read waits on a
table lock the test holds in PostgreSQL, the call sleeps in its executor, the
Writer's transaction waits on a lock of the sink table. The test sees the wait
(``pg_stat_activity``, the Worker's log), cancels, and checks what the issue of
each phase must be:

* ALLOCATED: not submitted, nothing changes (its slot frees itself at its TTL);
* BUILDER: the Builder's query is stopped, the task fails CANCELLED, not retryable;
* CALLS: the sleeping call's executor is killed after the cancel grace, the
  Writer never runs (nothing in the sink);
* WRITER: the transaction under way is not interrupted: the task ends SUCCEEDED,
  its row written;

and that twice is the same as once, and the waiting ``run`` (a Watch stream) gets
the cancelled result.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from processes import ConsoleProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import (
    CancelOutcome,
    Client,
    PluginConfig,
    Task,
    TaskNotFoundError,
    TaskResult,
    TaskState,
)
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
import os
import time


def nap(i, ms):
    os.write(1, f"napping {i}\\n".encode())
    time.sleep(ms / 1000)
    return {"id": i}


def row(i):
    return {"id": i}
"""
SINK_TABLE = "cancelled_rows"
CANCELLED = "cancelled by a client"


@dataclass
class Cluster:
    worker: WorkerProcess
    db_url: str
    client: Client


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of a Unix socket path.
    path = Path(tempfile.mkdtemp(prefix="bxc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def cluster(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    postgres_url: str,
    socket_dir: Path,
    tmp_path: Path,
) -> AsyncIterator[Cluster]:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "held.py").write_text(FUNCTIONS)
    lane = unique_lane()
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": lane,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
            "BLOCKDB_URL": postgres_url,
            "SINK_DB_URL": postgres_url,
        },
        tmp_path / "worker.log",
    )
    proxy = ConsoleProcess(
        "blockx-proxy",
        {
            "PROXY_SOCKET_PATH": str(socket_dir / "p.sock"),
            "PROXY_COORDINATOR_ADDR": f"127.0.0.1:{free_port()}",
            "PROXY_SYNC_INVOKER_ADDR": f"127.0.0.1:{free_port()}",
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "PROXY_REGISTRY_PREFIXES": lane,
        },
        tmp_path / "proxy.log",
    )
    client = Client(proxy_socket=str(socket_dir / "p.sock"))
    try:
        await worker.wait_ready()

        async def forwarded() -> bool:
            proxy.assert_alive()
            try:
                await client.get_task_result("probe", worker_addr=worker.addr)
            except TaskNotFoundError:
                return True  # the Worker's own answer, through the proxy
            except Exception:
                return False
            return True

        await wait_until(forwarded, "the proxy forwarding to the worker", timeout=30)
        yield Cluster(worker, postgres_url, client)
    finally:
        await client.close()
        proxy.stop()
        assert worker.stop() == 0
    assert "Traceback" not in worker.output()


def held_task(task_id: str, builder: str, config: dict[str, object]) -> Task:
    return Task(
        task_id=task_id,
        function_call_config=PluginConfig(type=builder, config=config),
        result_handler=PluginConfig(
            type="TableUpsertsResultHandler", config={"table": SINK_TABLE, "key": "id"}
        ),
    )


async def lock_waits(db: asyncpg.Connection) -> int:
    """Sessions of the Worker waiting on a lock the test holds."""
    found: int = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND pid <> pg_backend_pid()"
    )
    return found


async def holding_lock(db: asyncpg.Connection, table: str) -> asyncpg.transaction.Transaction:
    tx = db.transaction()
    await tx.start()
    await db.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    return tx


def assert_cancelled(result: TaskResult) -> None:
    assert (result.state, result.failure_code, result.retryable, result.failure_message) == (
        TaskState.FAILED,
        "CANCELLED",
        False,
        CANCELLED,
    ), result


async def test_cancel_at_every_phase_through_the_proxy(cluster: Cluster) -> None:
    client, addr = cluster.client, cluster.worker.addr
    db = await asyncpg.connect(cluster.db_url)
    try:
        # A first task creates the sink table (the Writer phase below locks it).
        first = await client.run(
            held_task("c-first", "CallListCallConfig", _calls([[0]])), worker_addr=addr
        )
        assert first.ok, first

        # ALLOCATED: nothing runs; the reservation stands.
        await client.request_task_slot(addr, "c-allocated", ttl_ms=60_000)
        reserved = await client.cancel("c-allocated", worker_addr=addr)
        assert (reserved.outcome, reserved.state) == (
            CancelOutcome.NOT_SUBMITTED,
            TaskState.ALLOCATED,
        )
        assert "not submitted" in reserved.detail
        still = await client.get_task_result("c-allocated", worker_addr=addr)
        assert still.state is TaskState.ALLOCATED

        # BUILDER: its read of the block database waits on our lock of `blocks`.
        tx = await holding_lock(db, "blocks")
        building = asyncio.create_task(
            client.run(
                held_task("c-builder", "BlockTableCallConfig", _block_table()), worker_addr=addr
            )
        )
        await wait_until(lambda: _waiting(db), "the builder waiting on the lock", timeout=30)
        # The client knows where its run placed the task: no worker_addr needed.
        answer = await client.cancel("c-builder")
        assert answer.outcome is CancelOutcome.CANCELLED
        assert answer.result is not None
        assert_cancelled(answer.result)
        assert_cancelled(await asyncio.wait_for(building, 30))
        # The Builder stopped: its query no longer waits, before the lock is let go.
        await wait_until(lambda: _none_waiting(db), "the builder's query stopped", timeout=30)
        await tx.rollback()
        # Twice is the same as once.
        assert await client.cancel("c-builder", worker_addr=addr) == answer

        # CALLS: a call sleeps in its executor.
        napping = asyncio.create_task(
            client.run(held_task("c-calls", "CallListCallConfig", _nap(7)), worker_addr=addr)
        )
        await wait_until(
            lambda: "napping 7" in cluster.worker.output(), "the call running", timeout=30
        )
        answer = await client.cancel("c-calls", worker_addr=addr)
        assert answer.outcome is CancelOutcome.CANCELLED
        assert_cancelled(await asyncio.wait_for(napping, 30))
        # The call did not stop by itself: the watchdog kills its executor.
        await wait_until(
            lambda: "a cancelled call still held it" in cluster.worker.output(),
            "the sleeping call's executor killed",
            timeout=30,
        )
        # Its Writer never ran.
        assert await db.fetchval(f"SELECT count(*) FROM {SINK_TABLE} WHERE id = 7") == 0

        # WRITER: the transaction waits on our lock of the sink table; it is let finish.
        tx = await holding_lock(db, SINK_TABLE)
        writing = asyncio.create_task(
            client.run(held_task("c-writer", "CallListCallConfig", _calls([[9]])), worker_addr=addr)
        )
        await wait_until(lambda: _waiting(db), "the writer waiting on the lock", timeout=30)
        answer = await client.cancel("c-writer", worker_addr=addr)
        assert (answer.outcome, answer.state, answer.result) == (
            CancelOutcome.WRITING,
            TaskState.RUNNING,
            None,
        )
        await tx.commit()
        written = await asyncio.wait_for(writing, 30)
        assert written.ok, written
        assert await db.fetchval(f"SELECT count(*) FROM {SINK_TABLE} WHERE id = 9") == 1
        after = await client.cancel("c-writer", worker_addr=addr)
        assert (after.outcome, after.state) == (CancelOutcome.FINISHED, TaskState.SUCCEEDED)

        # Unknown: NOT_FOUND, as GetTaskResult says.
        with pytest.raises(TaskNotFoundError):
            await client.cancel("c-never", worker_addr=addr)
    finally:
        await db.close()


def _calls(calls: list[list[object]]) -> dict[str, object]:
    return {"function": "row", "callList": calls}


def _nap(i: int) -> dict[str, object]:
    return {"function": "nap", "callList": [[i, 600_000]]}


def _block_table() -> dict[str, object]:
    return {"function": "row", "table": "blocks", "block": 0}


async def _waiting(db: asyncpg.Connection) -> bool:
    return await lock_waits(db) > 0


async def _none_waiting(db: asyncpg.Connection) -> bool:
    return await lock_waits(db) == 0
