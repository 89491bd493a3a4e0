"""A BlockX cluster on six hosts of its own: etcd, two coordinators, three workers.

The hosts come from a ``Topology``: network namespaces on a bridge (``NetnsTopology``,
a host is a namespace and a partition is its veth down) or loopback addresses
127.0.0.x with TCP proxies in front of each worker and of each worker's etcd
connection (``ProxyTopology``, a partition is its proxies gone silent). Either
way each process binds its own address, and every process can be killed -9 and
restarted on the same address and port, so clients keep their addresses.

The periods are short so that a fault and its recovery take seconds: heartbeats
every 200 ms under 2 s leases, 2 s heartbeat timeout and watch grace on the
coordinators, 2 s slot leases.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

import psutil
from processes import CoordinatorProcess, WorkerProcess
from support import free_port, wait_until

from blockx_core.registry import RegistryKind, v2_registry_prefix
from blockx_server.etcd.local import find_etcd_binary
from faults.netns import Netns
from faults.partition import LinkProxy, ProxyLinks

WORKERS: Final = ("w1", "w2", "w3")
COORDINATORS: Final = ("c1", "c2")
REGISTRY_PREFIX: Final = v2_registry_prefix("test", "faults", RegistryKind.BLOCK)
SLOT_TTL_MS: Final = 2000
SINK_TABLE: Final = "marks"

# One call of a task: sleeps, then returns a row whose nonce is new on every run,
# so the sink holds one row per (task_id, index) per commit of the task's Writer.
FUNCTIONS: Final = """
def mark(task_id, index, ms):
    import time, uuid
    time.sleep(ms / 1000)
    return {"nonce": uuid.uuid4().hex, "task_id": task_id, "idx": index}
"""

_WORKER_ENV: Final = {
    "WORKER_REGISTRY_PREFIX": REGISTRY_PREFIX,
    "WORKER_HEARTBEAT_INTERVAL": "200",
    "WORKER_LEASE_TTL_S": "2",
    "TASK_SLOTS": "8",
    "DEFAULT_SLOT_TTL_MS": str(SLOT_TTL_MS),
    "CALL_DEADLINE_MS": "30000",
}
_COORDINATOR_ENV: Final = {
    "COORDINATOR_REGISTRY_PREFIXES": REGISTRY_PREFIX,
    "COORDINATOR_HEARTBEAT_TIMEOUT_MS": "2000",
    "COORDINATOR_WATCH_GRACE_PERIOD_MS": "2000",
    "COORDINATOR_SLOT_TTL_MS": str(SLOT_TTL_MS),
    "COORDINATOR_CIRCUIT_BREAKER_COOLDOWN_MS": "1000",
}


class Host(Protocol):
    @property
    def addr(self) -> str: ...
    @property
    def wrapper(self) -> tuple[str, ...]: ...


class Topology(Protocol):
    """Where the cluster's processes live and how one host is cut off."""

    kind: str

    def host(self, name: str) -> Host: ...

    async def worker_links(self, name: str, port: int, etcd_endpoint: str) -> tuple[str, str]:
        """The address everyone reaches worker ``name`` at, and the etcd endpoint it
        dials."""
        ...

    def cut(self, name: str) -> None: ...
    def heal(self, name: str) -> None: ...
    async def close(self) -> None: ...


class NetnsTopology:
    kind = "netns"

    def __init__(self) -> None:
        self.netns = Netns()

    def host(self, name: str) -> Host:
        return self.netns.add_host(name)

    async def worker_links(self, name: str, port: int, etcd_endpoint: str) -> tuple[str, str]:
        return f"{self.netns.hosts[name].addr}:{port}", etcd_endpoint

    def cut(self, name: str) -> None:
        self.netns.cut(name)

    def heal(self, name: str) -> None:
        self.netns.heal(name)

    async def close(self) -> None:
        self.netns.close()


class LoopbackHost:
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.wrapper: tuple[str, ...] = ()


class ProxyTopology:
    """Hosts 127.0.0.11, .12, ...; a worker is reached through a proxy on 127.0.0.1
    (its advertised address) and reaches etcd through a proxy of its own."""

    kind = "proxy"

    def __init__(self) -> None:
        self._hosts: dict[str, LoopbackHost] = {}
        self.links = ProxyLinks()

    def host(self, name: str) -> Host:
        host = LoopbackHost(f"127.0.0.{11 + len(self._hosts)}")
        self._hosts[name] = host
        return host

    async def worker_links(self, name: str, port: int, etcd_endpoint: str) -> tuple[str, str]:
        etcd_host, etcd_port = etcd_endpoint.rsplit(":", 1)
        served = LinkProxy("127.0.0.1", free_port(), self._hosts[name].addr, port)
        to_etcd = LinkProxy("127.0.0.1", free_port(), etcd_host, int(etcd_port))
        await self.links.add(name, served)
        await self.links.add(name, to_etcd)
        return served.endpoint, to_etcd.endpoint

    def cut(self, name: str) -> None:
        self.links.cut(name)

    def heal(self, name: str) -> None:
        self.links.heal(name)

    async def close(self) -> None:
        await self.links.close()


async def _run(*argv: str) -> str:
    """Run a short command without blocking the loop (the proxies run on it)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return out.decode(errors="replace")


class EtcdProcess:
    """A single-member etcd on ``host``, killed and restarted on the same data dir.
    ``start(private=True)`` serves clients on the host's 127.0.0.1 only, where no
    coordinator or worker can reach it (etcdctl runs beside it)."""

    def __init__(self, host: Host, root: Path) -> None:
        self.host = host
        self.port = free_port()
        self.private_port = free_port()
        self._peer_port = free_port()
        self._data = root / "etcd-data"
        self._log = root / "etcd.log"
        self._binary = find_etcd_binary()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host.addr}:{self.port}"

    def _client_url(self, private: bool) -> str:
        return f"http://127.0.0.1:{self.private_port}" if private else f"http://{self.endpoint}"

    async def start(self, *, private: bool = False) -> None:
        self._spawn(private)

        async def healthy() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, self._log.read_text()
            return '"health":true' in await self.ctl(private, "endpoint", "health", "-w", "json")

        await wait_until(healthy, "etcd healthy", timeout=20, interval=0.1)

    def _spawn(self, private: bool) -> None:
        url = self._client_url(private)
        peer = f"http://127.0.0.1:{self._peer_port}"
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.host.wrapper, str(self._binary),
                    "--name", "faults", "--data-dir", str(self._data),
                    "--listen-client-urls", url, "--advertise-client-urls", url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"faults={peer}",
                    "--heartbeat-interval", "20", "--election-timeout", "200",
                    "--log-level", "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def ctl(self, private: bool, *args: str) -> str:
        etcdctl = str(self._binary.with_name("etcdctl"))
        url = self._client_url(private)
        return await _run(
            *self.host.wrapper,
            etcdctl,
            f"--endpoints={url}",
            "--dial-timeout=1s",
            "--command-timeout=2s",
            *args,
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class FaultCluster:
    def __init__(self, topology: Topology, root: Path) -> None:
        self.topology = topology
        self.root = root
        self.functions = root / "functions"
        self.functions.mkdir()
        (self.functions / "mark.py").write_text(FUNCTIONS)
        self.etcd = EtcdProcess(topology.host("etcd"), root)
        self._hosts = {name: topology.host(name) for name in (*COORDINATORS, *WORKERS)}
        self._coordinator_ports = {name: free_port() for name in COORDINATORS}
        self._worker_ports = {name: free_port() for name in WORKERS}
        self.coordinators: dict[str, CoordinatorProcess] = {}
        self.workers: dict[str, WorkerProcess] = {}
        self.worker_addrs: dict[str, str] = {}
        self._worker_etcd: dict[str, str] = {}
        self._runs = 0

    @property
    def kind(self) -> str:
        return self.topology.kind

    def coordinator_addr(self, name: str) -> str:
        return f"{self._hosts[name].addr}:{self._coordinator_ports[name]}"

    def sink_path(self, name: str) -> Path:
        return self.root / f"sink-{name}.db"

    def _log(self, name: str) -> Path:
        self._runs += 1
        return self.root / f"{name}-{self._runs}.log"

    async def start(self) -> None:
        await self.etcd.start()
        for name in WORKERS:
            advertised, etcd = await self.topology.worker_links(
                name, self._worker_ports[name], self.etcd.endpoint
            )
            self.worker_addrs[name] = advertised
            self._worker_etcd[name] = etcd
            self.start_worker(name)
        for name in COORDINATORS:
            self.start_coordinator(name)
        await self.ready()

    def start_worker(self, name: str) -> WorkerProcess:
        host = self._hosts[name]
        self.workers[name] = WorkerProcess(
            {
                **_WORKER_ENV,
                "ETCD_ENDPOINTS": self._worker_etcd[name],
                "WORKER_ADVERTISE_ADDR": self.worker_addrs[name],
                "FUNCTIONS_DIR": str(self.functions),
                "SINK_DB_URL": f"sqlite:///{self.sink_path(name)}",
            },
            self._log(name),
            port=self._worker_ports[name],
            host=host.addr,
            wrapper=host.wrapper,
        )
        return self.workers[name]

    def start_coordinator(self, name: str) -> CoordinatorProcess:
        host = self._hosts[name]
        port = self._coordinator_ports[name]
        proc = CoordinatorProcess(
            {
                **_COORDINATOR_ENV,
                "ETCD_ENDPOINTS": self.etcd.endpoint,
                "COORDINATOR_LISTEN": f"{host.addr}:{port}",
            },
            self._log(name),
            host=host.addr,
            wrapper=host.wrapper,
        )
        proc.port = port
        self.coordinators[name] = proc
        return proc

    async def ready(self, timeout: float = 30) -> None:
        """Every process serves and both coordinators see all three workers."""
        for worker in self.workers.values():
            await worker.wait_ready()
        for coordinator in self.coordinators.values():
            await coordinator.wait_serving()

        def all_seen() -> bool:
            return all(self.workers_seen(name) == len(WORKERS) for name in COORDINATORS)

        await wait_until(all_seen, "both coordinators see three workers", timeout=timeout)

    def workers_seen(self, coordinator: str) -> int | None:
        try:
            metrics = self.coordinators[coordinator].metrics()
        except OSError:
            return None
        for line in metrics.splitlines():
            if line.startswith('blockx_coordinator_registry_workers{format="v2"}'):
                return int(float(line.split()[-1]))
        return None

    def allocated_slots(self, name: str) -> int | None:
        """The worker's ALLOCATED slots, from its metrics (None: no answer)."""
        try:
            metrics = self.workers[name].metrics()
        except OSError:
            return None
        for line in metrics.splitlines():
            if line.startswith('blockx_worker_slots{state="allocated"}'):
                return int(float(line.split()[-1]))
        return None

    def compacted_watches(self) -> int:
        """Watch starts the coordinators logged as compacted (each one re-listed)."""
        logs = self.root.glob("c[0-9]-*.log")
        return sum(log.read_text(errors="replace").count("compacted below") for log in logs)

    def executor_pids(self, name: str) -> list[int]:
        """The worker's executor processes (``python -m blockx_executor``), wherever
        in its process tree they run."""
        tree = psutil.Process(self.workers[name].proc.pid).children(recursive=True)
        found: list[int] = []
        for child in tree:
            try:
                if "blockx_executor" in " ".join(child.cmdline()):
                    found.append(child.pid)
            except psutil.Error:
                continue
        return found

    def sink_rows(self) -> list[tuple[str, int, str]]:
        """(task_id, idx, nonce) of every row every worker's Writer committed."""
        rows: list[tuple[str, int, str]] = []
        for name in WORKERS:
            path = self.sink_path(name)
            if not path.exists():
                continue
            with sqlite3.connect(path) as db:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
                if SINK_TABLE in tables:
                    rows += db.execute(f"SELECT task_id, idx, nonce FROM {SINK_TABLE}").fetchall()
        return rows

    async def close(self) -> None:
        for proc in (*self.coordinators.values(), *self.workers.values()):
            if proc.alive():
                proc.kill()
        self.etcd.kill()
        await self.topology.close()


def kill_9(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
