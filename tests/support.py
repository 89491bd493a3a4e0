"""Helpers shared by the test modules: fake clock, heartbeat builder, polling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterator

from blockx_core.heartbeat import WorkerHeartbeat
from blockx_core.worker import TaskPhase, WorkerCore

NOW_MS = 1_700_000_000_000


class FakeClock:
    """A Clock whose time moves only when a test moves it."""

    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def heartbeat(
    addr: str, *, slots: int = 10, used: int = 0, at_ms: int = NOW_MS, **fields: float
) -> WorkerHeartbeat:
    """A heartbeat with ``slots`` task slots of which ``used`` are reserved."""
    return WorkerHeartbeat(
        worker_addr=addr,
        task_slots=slots,
        reserved_slots=used,
        last_heartbeat_ms=at_ms,
        **fields,  # type: ignore[arg-type]
    )


# Ports handed out below the kernel's ephemeral range (32768-60999 here): a port
# from that range can be taken by any outgoing connection (to etcd, PostgreSQL, a
# node) between the test choosing it and the server binding it. Each pytest-xdist
# worker (PYTEST_XDIST_WORKER=gw0, gw1, ...) draws from a slice of its own, so two
# workers never pick the same port before either binds it.
_ALL_PORTS = range(20_000, 32_000)
_SLICES = 8


def _ports_of_this_process() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return _ALL_PORTS
    size = len(_ALL_PORTS) // _SLICES
    start = _ALL_PORTS.start + (int(worker[2:]) % _SLICES) * size
    return range(start, start + size)


_PORTS = _ports_of_this_process()
_given: set[int] = set()


def _bound_port() -> socket.socket:
    """A socket bound to a loopback port of this process's slice, never handed out
    twice in one run."""
    for _ in range(1000):
        port = random.choice(_PORTS)
        if port in _given:
            continue
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        _given.add(port)
        return sock
    raise RuntimeError(f"no free loopback port in {_PORTS.start}-{_PORTS.stop - 1}")


def free_port() -> int:
    """A loopback port nobody listens on, never handed out twice in one run."""
    with _bound_port() as sock:
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def dead_addr() -> Iterator[str]:
    """A loopback ``host:port`` that refuses connections for as long as the block
    runs: the port stays bound, never listening, so no server started meanwhile (a
    dev cluster draws its ports from a range of its own) can take it."""
    with _bound_port() as sock:
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state, then the
    parent's pid, ...); None once the process has exited (gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields


def children_of(parent: int) -> list[int]:
    """The live processes whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and int(fields[1]) == parent:
                found.append(int(entry))
    return found


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
) -> None:
    """Poll ``condition`` until true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


class TcpProxy:
    """A TCP relay to ``127.0.0.1:target_port`` that plays the network between a
    client and a server: ``cut`` refuses and resets connections, ``freeze`` keeps them
    open while holding every byte until ``thaw`` (a slow network), and
    ``freeze(drop=True)`` silently discards them (a silent network loss)."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._dropping = False

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Refuse new connections and reset the open ones (the server stays up)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def freeze(self, *, drop: bool = False) -> None:
        self._dropping = drop
        self._flowing.clear()

    def thaw(self) -> None:
        self._dropping = False
        self._flowing.set()

    async def close(self) -> None:
        self.thaw()
        await self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        # Pumps of their own: cancelling them on close must not cancel asyncio's
        # connection callback task (3.11 logs an error for that).
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self._dropping:
                    continue
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()
            self._writers.discard(writer)


# An answer's token: the task's current one when it is in ``phase``, else one never
# issued (tokens start at 1), which the core refuses as stale.
STALE = 0


def token(core: WorkerCore, task_id: str, phase: TaskPhase) -> int:
    now = core.phase_token(task_id)
    return now if now is not None and core.task_phase(task_id) is phase else STALE


def current_token(core: WorkerCore, task_id: str) -> int:
    """The token of the task's current activation (it must have one)."""
    now = core.phase_token(task_id)
    assert now is not None
    return now
