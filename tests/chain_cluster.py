"""One cluster (block or bundle) over a block database and a sink, as real processes:
a Coordinator and a Worker registered under a lane of their own in the session's
etcd. The Worker keeps its port across a restart, as a restarted host would."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processes import CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_client import Client
from blockx_core.registry import RegistryKind, v2_registry_prefix
from blockx_server.etcd.local import EtcdServer


class ChainCluster:
    def __init__(
        self,
        etcd: EtcdServer,
        root: Path,
        kind: RegistryKind,
        *,
        chain_url: str,
        sink_url: str,
        functions: Path,
        **worker_env: str,
    ) -> None:
        self.kind = kind
        self.root = root
        self.prefix = v2_registry_prefix("test", f"t-{secrets.token_hex(5)}", kind)
        self.worker_port = free_port()
        self.worker_env = {
            "ETCD_ENDPOINTS": etcd.endpoint,
            "WORKER_REGISTRY_PREFIX": self.prefix,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(functions),
            "BLOCKDB_URL": chain_url,
            "SINK_DB_URL": sink_url,
            **worker_env,
        }
        self.starts = 0
        self.worker = self._start_worker()
        bundle = kind is RegistryKind.BUNDLE
        self.coordinator = CoordinatorProcess(
            {"ETCD_ENDPOINTS": etcd.endpoint, "COORDINATOR_REGISTRY_PREFIXES": self.prefix},
            root / f"{kind.value}-coordinator.log",
            program="blockx-bundle-coordinator" if bundle else "blockx-coordinator",
        )

    @property
    def bundle(self) -> bool:
        return self.kind is RegistryKind.BUNDLE

    @property
    def coordinator_addr(self) -> str:
        return f"127.0.0.1:{self.coordinator.port}"

    def _start_worker(self) -> WorkerProcess:
        self.starts += 1
        return WorkerProcess(
            self.worker_env,
            self.root / f"{self.kind.value}-worker-{self.starts}.log",
            program="blockx-bundle-worker" if self.bundle else "blockx-worker",
            port=self.worker_port,
        )

    async def wait_ready(self) -> None:
        await self.worker.wait_ready()

        def sees_worker() -> bool:
            self.coordinator.assert_alive()
            try:
                metrics = self.coordinator.metrics()
            except OSError:
                return False
            return 'blockx_coordinator_registry_workers{format="v2"} 1.0' in metrics

        await wait_until(sees_worker, "the coordinator's view of the worker", timeout=30)

    def kill_worker(self) -> None:
        self.worker.kill()

    async def restart_worker(self) -> None:
        self.worker = self._start_worker()
        await self.worker.wait_ready()

    def client(self) -> Client:
        if self.bundle:
            return Client(bundle_coordinator=self.coordinator_addr, coordinator="127.0.0.1:1")
        return Client(coordinator=self.coordinator_addr)

    def cli_args(self) -> list[str]:
        flag = "--bundle-coordinator" if self.bundle else "--coordinator"
        return [flag, self.coordinator_addr]

    def stop(self) -> None:
        self.worker.stop()
        self.coordinator.stop()

    @contextmanager
    def serving(self) -> Iterator[ChainCluster]:
        """The cluster, ready, for the body of the block (from synchronous code such as
        a fixture); stopped after it, and its Worker's log free of tracebacks."""
        try:
            asyncio.run(self.wait_ready())
            yield self
        finally:
            self.stop()
        assert "Traceback" not in self.worker.output()
