"""The bundle coordinator's ExplainPlacement, end to end: a real etcd, a real
``blockx-bundle-coordinator`` with a scripted full bundle worker; what the raw
gRPC stub, ``SyncClient.explain_placement`` and ``blockx why --cluster bundle``
get back."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aetcd
import pytest
from grpclib.client import Channel
from processes import CoordinatorProcess
from support import heartbeat, wait_until

from blockx_client import Client, Cluster, InvalidRequestError, SyncClient
from blockx_core.heartbeat import encode_heartbeat
from blockx_core.registry import RegistryKind
from blockx_proto import bundlecoordinator_v1, coordinator_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.clock import SYSTEM_CLOCK

FULL = "127.0.0.1:1"


def _blockx(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("blockx") or str(Path(sys.executable).parent / "blockx")
    return subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "220"},
    )


async def test_the_bundle_coordinator_answers_explain_placement(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    prefix = unique_lane(RegistryKind.BUNDLE)
    etcd = aetcd.Client(etcd_server.host, etcd_server.port, timeout=5)
    try:
        full = heartbeat(FULL, slots=4, used=4, at_ms=SYSTEM_CLOCK.now_ms())
        await etcd.put((prefix + FULL).encode(), encode_heartbeat(full))
    finally:
        await etcd.close()
    coordinator = CoordinatorProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "COORDINATOR_REGISTRY_PREFIXES": prefix,
            # The scripted heartbeat is written once: keep it fresh for the test.
            "COORDINATOR_HEARTBEAT_TIMEOUT_MS": "60000",
        },
        tmp_path / "bundle-coordinator.log",
        "blockx-bundle-coordinator",
    )
    address = f"127.0.0.1:{coordinator.port}"
    try:
        await coordinator.wait_serving()

        # The raw stub: the bundle service's own route, coordinator.v1's messages.
        async def sees_the_worker() -> bool:
            channel = Channel(coordinator.host, coordinator.port)
            try:
                reply = await bundlecoordinator_v1.BundleCoordinatorServiceStub(
                    channel
                ).explain_placement(coordinator_v1.ExplainPlacementRequest(), timeout=5)
            finally:
                channel.close()
            return reply.view_trusted and [w.worker_addr for w in reply.workers] == [FULL]

        await wait_until(sees_the_worker, "the bundle coordinator's view", timeout=30)

        def explain() -> tuple[str, bool, str]:
            with SyncClient(bundle_coordinator=address) as client:
                report = client.explain_placement(cluster=Cluster.BUNDLE)
            (worker,) = report.workers
            return report.coordinator, worker.eligible, worker.reason

        assert await asyncio.to_thread(explain) == (address, False, "full 4/4")

        shown = await asyncio.to_thread(
            _blockx, "--bundle-coordinator", address, "why", "--cluster", "bundle", "--json"
        )
        assert shown.returncode == 0, shown.stderr
        document = json.loads(shown.stdout)
        assert document["cluster"] == "bundle"
        assert document["coordinator"] == address
        assert [(w["worker_addr"], w["kind"]) for w in document["workers"]] == [(FULL, "full")]
        table = await asyncio.to_thread(
            _blockx, "--bundle-coordinator", address, "why", "--cluster", "bundle"
        )
        assert table.returncode == 0, table.stderr
        assert "0 of 1 worker(s) eligible" in table.stdout
        assert "full 4/4" in table.stdout
    finally:
        assert coordinator.stop() == 0


async def test_the_bundle_cluster_needs_its_coordinator_configured() -> None:
    async with Client(coordinator="127.0.0.1:1") as client:
        with pytest.raises(InvalidRequestError, match="no bundle coordinator is configured"):
            await client.explain_placement(cluster=Cluster.BUNDLE)


def test_sync_client_explains_as_client_does() -> None:
    """SyncClient.explain_placement takes what Client.explain_placement takes."""
    asynchronous = inspect.signature(Client.explain_placement).parameters
    synchronous = inspect.signature(SyncClient.explain_placement).parameters
    assert [(p.name, p.kind, p.default) for p in synchronous.values()] == [
        (p.name, p.kind, p.default) for p in asynchronous.values()
    ]
