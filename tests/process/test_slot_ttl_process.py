"""The slot TTL cap on both sides: a real ``blockx-worker`` whose MAX_SLOT_TTL_MS is
below what a real ``blockx-coordinator`` asks for, and the Coordinators' start-up
check of COORDINATOR_SLOT_TTL_MS against the Workers' default cap."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import Client, InvalidRequestError
from blockx_core.coordinator import ReasonKind
from blockx_core.worker import WorkerConfig
from blockx_server.etcd.local import EtcdServer


async def test_a_ttl_above_a_workers_cap_fails_with_its_message_and_spares_the_worker(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    """The override says the Workers allow 5000 ms, this one allows 3000: each
    reservation fails at once with the Worker's INVALID_ARGUMENT, more times than it
    takes to open a breaker, and the Worker stays eligible, no failure counted; a
    Coordinator asking for a TTL it allows is then granted a slot there."""
    prefix = unique_lane()
    (tmp_path / "functions").mkdir()
    shutil.copy(EXAMPLES / "functions" / "hello.py", tmp_path / "functions" / "hello.py")
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(tmp_path / "functions"),
            "EXECUTOR_COUNT": "1",
            "MAX_SLOT_TTL_MS": "3000",
            "DEFAULT_SLOT_TTL_MS": "3000",
        },
        tmp_path / "worker.log",
    )
    coordinators: list[CoordinatorProcess] = []

    def coordinator(name: str, **env: str) -> CoordinatorProcess:
        process = CoordinatorProcess(
            {
                "ETCD_ENDPOINTS": etcd_server.endpoint,
                "COORDINATOR_REGISTRY_PREFIXES": prefix,
                # Generous: on a loaded host a timed-out try would be retried, not refused.
                "COORDINATOR_WORKER_RPC_TIMEOUT_MS": "10000",
                **env,
            },
            tmp_path / f"{name}.log",
        )
        coordinators.append(process)
        return process

    async def sees_the_worker(client: Client) -> None:
        async def eligible() -> bool:
            return len((await client.explain_placement()).eligible) == 1

        await wait_until(eligible, "the worker in the coordinator's view", timeout=20)

    too_long = coordinator(
        "too-long", COORDINATOR_SLOT_TTL_MS="5000", COORDINATOR_WORKERS_MAX_SLOT_TTL_MS="5000"
    )
    fitting = coordinator("fitting", COORDINATOR_SLOT_TTL_MS="3000")
    try:
        await worker.wait_ready()
        async with Client(coordinator=f"127.0.0.1:{too_long.port}") as client:
            await too_long.wait_serving()
            await sees_the_worker(client)
            [view] = (await client.explain_placement()).workers
            addr = view.worker_addr
            threshold = 3  # COORDINATOR_CIRCUIT_BREAKER_THRESHOLD's default
            for i in range(threshold + 1):
                with pytest.raises(InvalidRequestError) as caught:
                    await client.reserve_worker_slot(f"t-{i}", deadline_s=20)
                assert caught.value.message == (
                    f"INVALID_ARGUMENT: {addr} answered INVALID_ARGUMENT: ttl_ms 5000 exceeds "
                    "MAX_SLOT_TTL_MS (3000)"
                )
            report = await client.explain_placement()
            [view] = report.workers
            assert (view.kind, view.recent_failures, view.breaker_remaining_ms) == (
                ReasonKind.ELIGIBLE,
                0,
                0,
            )
            # ExplainPlacement keeps the refusal with what the Worker answered.
            latest = report.recent_refusals[0]
            assert (latest.task_id, latest.code) == (f"t-{threshold}", "InvalidArgument")
            assert [w.worker_addr for w in latest.workers] == [addr]

        await fitting.wait_serving()
        async with Client(coordinator=f"127.0.0.1:{fitting.port}") as client:
            await sees_the_worker(client)
            reservation = await client.reserve_worker_slot("t-fits", deadline_s=20)
            assert reservation.worker_addr == addr
    finally:
        for process in coordinators:
            process.stop()
        assert worker.stop() == 0
    assert "Traceback" not in worker.output()


@pytest.mark.parametrize("program", ["blockx-coordinator", "blockx-bundle-coordinator"])
def test_a_ttl_above_the_workers_default_cap_is_refused_at_start_up(program: str) -> None:
    binary = shutil.which(program)
    assert binary is not None
    cap = WorkerConfig().max_slot_ttl_ms
    result = subprocess.run(
        [binary],
        env={
            **os.environ,
            "COORDINATOR_LISTEN": f"127.0.0.1:{free_port()}",
            "COORDINATOR_SLOT_TTL_MS": str(cap + 1),
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        f"{program}: invalid configuration: COORDINATOR_SLOT_TTL_MS must be <= "
        f"COORDINATOR_WORKERS_MAX_SLOT_TTL_MS, the Workers' MAX_SLOT_TTL_MS ({cap + 1} > {cap})"
    ), line
