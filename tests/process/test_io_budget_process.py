"""A slow chain node behind a real ``blockx-worker``: a call is charged the time the
node takes to answer it, never the time it waits for its turn (adaptive admission
held to one request at a time), and a call whose own reads outlast its budget fails
BUDGET_EXCEEDED. The node is a scripted JSON-RPC server that answers
every request after a fixed delay (distinct accounts, so no two reads are shared)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from processes import WorkerProcess, call_list_task, execute_result, run_to_end
from rpc_scripted import ScriptedRpcServer, answer, each

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
from blockx_executor import io


def _account(i):
    return "0x" + format(i, "040x")


async def balance(i):
    return await io.rpc.balance(_account(i))


async def balances(n):
    return [await io.rpc.balance(_account(i)) for i in range(n)]
"""

DELAY_S = 0.15


async def test_queueing_for_a_slow_node_is_not_charged_but_its_answers_are(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    in_flight = 0
    most_in_flight = 0

    async def slow(request: Any) -> tuple[int, bytes]:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        try:
            await asyncio.sleep(DELAY_S)
        finally:
            in_flight -= 1
        return 200, each(request, lambda r: answer(r, "0x2a"))

    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "slow.py").write_text(FUNCTIONS)
    async with ScriptedRpcServer(slow) as node:
        worker = WorkerProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "WORKER_REGISTRY_PREFIX": unique_lane(),
                "FUNCTIONS_DIR": str(functions),
                "CHAIN_RPC_URL": node.url,
                # One node request at a time: the calls queue for it.
                "IO_BACKEND_MAX_CONCURRENCY": "1",
                "IO_QUEUE_TIMEOUT_MS": "30000",
                # Each call may spend 700 ms of CPU + backend time (room for a
                # busy host's start-up CPU); a queued call waits up to 7 x 150 ms
                # before its turn, and eight reads in one call take 8 x 150 ms.
                "CALL_DEADLINE_MS": "700",
                "TASK_INITIAL_INFLIGHT_CALLS": "8",
            },
            tmp_path / "worker.log",
        )
        try:
            await worker.wait_ready()
            channel = Channel("127.0.0.1", worker.port)
            try:
                stub = worker_v1.WorkerServiceStub(channel)
                queued = await run_to_end(
                    stub, call_list_task("t-queued", "balance", [[i] for i in range(8)])
                )
                over = await run_to_end(stub, call_list_task("t-over", "balances", [[8]]))
            finally:
                channel.close()
        finally:
            worker.stop()
    assert queued.state is worker_v1.TaskState.SUCCEEDED, queued
    execute = execute_result(queued)
    assert json.loads(execute.plugin_results[0].result) == ["42"] * 8
    # The node never saw more than one request at a time, so calls did queue.
    assert most_in_flight == 1
    assert over.state is worker_v1.TaskState.FAILED
    failed = execute_result(over)
    assert failed.failure_code == "CALL_FAILED"
    assert "BUDGET_EXCEEDED" in failed.failure_message
