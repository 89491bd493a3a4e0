"""ExecutorPool: the Worker's Python Executor child processes and their connections.

The pool listens on a Unix socket in a private temporary directory, spawns
``EXECUTOR_COUNT`` ``python -m blockx_executor`` processes with a scrubbed
environment, and hands every decoded message to its listener (the CallEngine).
A process that exits, or whose connection drops, is reported once as gone and
replaced by a new one (with a new executor id, so nothing of the old one can be
mistaken for the new). ``retire`` stops an idle executor the same way, on purpose
(it ran too many calls or grew too large). Sending is a buffered
``transport.write`` of one frame.

Each executor's stdout and stderr are one pipe the pool reads as it comes and
hands to the listener (``executor_output``): what functions print never goes to
the Worker's own stderr (a file there would put it under the executors'
RLIMIT_FSIZE), and a stalled reader only slows a printing call down.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Final, Protocol, cast

import msgspec

from blockx_executor.protocol import (
    ExecutorHeartbeat,
    FrameDecoder,
    FromExecutor,
    Hello,
    ProtocolError,
)
from blockx_server.calls.isolation import ExecutorIsolation, IsolationConfig, executor_environment
from blockx_server.runtime.process import signal_child

log = logging.getLogger(__name__)

_READ_BYTES: Final = 64 * 1024


class ExecutorPoolConfig(msgspec.Struct, frozen=True, kw_only=True):
    count: int = 8
    heartbeat_interval_ms: int = 200
    # What one call may print into the Worker's log (CALL_MAX_LOG_BYTES).
    max_log_bytes: int = 64 * 1024
    # RLIMIT_AS of each executor; 0 = no limit.
    memory_limit_bytes: int = 4 << 30
    max_open_files: int = 256
    # Refuse network, processes and file writes in user code (an audit hook).
    sandbox: bool = True
    # Wait before replacing an executor that died within its first second.
    respawn_backoff_ms: int = 500
    # The interpreter of executors that run as the Worker's user.
    python: str = sys.executable
    # The OS confinement: user, namespaces, private directory, limits.
    isolation: IsolationConfig = IsolationConfig()


class PoolListener(Protocol):
    def executor_up(self, executor_id: str) -> None: ...
    def executor_messages(self, executor_id: str, messages: list[FromExecutor]) -> None: ...
    def executor_gone(self, executor_id: str, reason: str) -> None: ...
    def executor_output(self, executor_id: str, data: bytes) -> None:
        """Bytes from the executor's stdout and stderr; b"" once they closed."""


class _Connection(asyncio.Protocol):
    """One executor's socket; the first message must be its Hello."""

    def __init__(self, pool: ExecutorPool) -> None:
        self._pool = pool
        self._decoder: FrameDecoder[FromExecutor] = FrameDecoder(FromExecutor)
        self.transport: asyncio.Transport | None = None
        self.executor_id: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's stream transports do not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as exc:
            log.error("executor %s broke the protocol: %s", self.executor_id, exc)
            self._abort()
            return
        if not messages:
            return
        if self.executor_id is None:
            hello = messages[0]
            if not isinstance(hello, Hello) or not self._pool._attach(hello, self):
                log.error("unexpected first message from an executor: %r", hello)
                self._abort()
                return
            messages = messages[1:]
            if not messages:
                return
        assert self.executor_id is not None
        self._pool._received(self.executor_id, messages)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.executor_id is not None:
            self._pool._gone(self.executor_id, "connection closed")

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class _Process:
    __slots__ = ("executor_id", "proc", "reader", "slot", "started", "up", "watcher")

    def __init__(self, slot: int, executor_id: str, proc: asyncio.subprocess.Process) -> None:
        self.slot = slot
        self.executor_id = executor_id
        self.proc = proc
        self.started = asyncio.get_running_loop().time()
        self.up = False
        self.watcher: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[None] | None = None


class ExecutorPool:
    def __init__(self, config: ExecutorPoolConfig, listener: PoolListener) -> None:
        self._config = config
        self._listener = listener
        self._dir: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._processes: dict[str, _Process] = {}
        self._connections: dict[str, _Connection] = {}
        self._generation = 0
        self._closing = False
        self._ready = asyncio.Event()
        self._spawns: set[asyncio.Task[None]] = set()
        self._isolation = ExecutorIsolation(
            config.isolation, python=config.python, sandbox=config.sandbox, count=config.count
        )
        self._retired: set[str] = set()  # stopped on purpose: their end is no loss

    @property
    def socket_path(self) -> Path:
        if self._dir is None:
            raise RuntimeError("the pool is not started")
        return self._dir / "executors.sock"

    def executor_ids(self) -> list[str]:
        return list(self._connections)

    @property
    def restarts(self) -> int:
        """Executors started after each slot's first: respawned after an exit or a kill."""
        return max(0, self._generation - self._config.count)

    def pid(self, executor_id: str) -> int | None:
        process = self._processes.get(executor_id)
        return None if process is None else process.proc.pid

    async def start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="blockx-executors-"))
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _Connection(self), path=str(self.socket_path)
        )
        for slot in range(self._config.count):
            await self._spawn(slot)

    async def wait_ready(self) -> None:
        """Every executor of the first generation has said hello and heartbeated."""
        await self._ready.wait()

    def heartbeat_seen(self, executor_id: str) -> None:
        process = self._processes.get(executor_id)
        if process is not None and not process.up:
            process.up = True
            if all(p.up for p in self._processes.values()):
                self._ready.set()

    def send(self, executor_id: str, frame: bytes) -> bool:
        """Write one encoded frame (``FrameEncoder``); False when the executor has no
        connection (it is gone)."""
        connection = self._connections.get(executor_id)
        if connection is None or connection.transport is None:
            return False
        connection.transport.write(frame)
        return True

    def kill(self, executor_id: str, reason: str) -> None:
        process = self._processes.get(executor_id)
        if process is None:
            return
        log.warning("killing executor %s (pid %d): %s", executor_id, process.proc.pid, reason)
        signal_child(process.proc)

    def retire(self, executor_id: str, reason: str) -> None:
        """Stop an executor that holds no calls, and start a fresh one in its place.

        Its connection is closed (after what is buffered for it); a connection that
        drops takes its process with it (``_gone``), and ``_watch`` spawns the
        replacement as for any executor that ended.
        """
        process = self._processes.get(executor_id)
        connection = self._connections.get(executor_id)
        if process is None:
            return
        log.info("retiring executor %s (pid %d): %s", executor_id, process.proc.pid, reason)
        self._retired.add(executor_id)
        if connection is not None and connection.transport is not None:
            connection.transport.close()
        else:
            signal_child(process.proc)

    async def close(self) -> None:
        self._closing = True
        for task in list(self._spawns):
            task.cancel()
        for process in list(self._processes.values()):
            signal_child(process.proc)
        for process in list(self._processes.values()):
            await process.proc.wait()
            for waiting in (process.watcher, process.reader):
                if waiting is not None:
                    waiting.cancel()
        for connection in list(self._connections.values()):
            if connection.transport is not None:
                connection.transport.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._isolation.close()

    # ---- internals -------------------------------------------------------------------

    async def _spawn(self, slot: int) -> None:
        self._generation += 1
        executor_id = f"x{slot}.{self._generation}"
        cfg = self._config
        assert self._dir is not None
        await self._isolation.prepare()
        private_dir = self._isolation.private_dir(executor_id)
        args = [
            "--socket",
            str(self.socket_path),
            "--executor-id",
            executor_id,
            "--heartbeat-interval-ms",
            str(cfg.heartbeat_interval_ms),
            "--memory-limit-bytes",
            str(cfg.memory_limit_bytes),
            "--max-open-files",
            str(cfg.max_open_files),
            "--max-log-bytes",
            str(cfg.max_log_bytes),
        ]
        if not cfg.sandbox:
            args.append("--no-sandbox")
        args += self._isolation.executor_args(private_dir)
        proc = await asyncio.create_subprocess_exec(
            *self._isolation.command(),  # the executor runtime when it switches user
            *args,
            env=executor_environment(private_dir),  # no credentials reach user code
            cwd=str(private_dir),
            start_new_session=True,  # the Worker's process group signals do not reach it
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        process = _Process(slot, executor_id, proc)
        self._processes[executor_id] = process
        process.watcher = asyncio.create_task(self._watch(process), name=f"watch {executor_id}")
        process.reader = asyncio.create_task(self._read(process), name=f"read {executor_id}")

    async def _watch(self, process: _Process) -> None:
        code = await process.proc.wait()
        self._gone(process.executor_id, f"process exited with code {code}")
        self._processes.pop(process.executor_id, None)
        self._isolation.release(process.executor_id)
        if self._closing:
            return
        lived = asyncio.get_running_loop().time() - process.started
        delay = self._config.respawn_backoff_ms / 1000 if lived < 1.0 else 0.0
        task = asyncio.create_task(self._respawn(process.slot, delay))
        self._spawns.add(task)
        task.add_done_callback(self._spawns.discard)

    async def _read(self, process: _Process) -> None:
        stream = process.proc.stdout
        assert stream is not None
        while data := await stream.read(_READ_BYTES):
            self._listener.executor_output(process.executor_id, data)
        self._listener.executor_output(process.executor_id, b"")

    async def _respawn(self, slot: int, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        if not self._closing:
            await self._spawn(slot)

    def _attach(self, hello: Hello, connection: _Connection) -> bool:
        if hello.executor_id not in self._processes or hello.executor_id in self._connections:
            return False
        connection.executor_id = hello.executor_id
        self._connections[hello.executor_id] = connection
        self._listener.executor_up(hello.executor_id)
        return True

    def _received(self, executor_id: str, messages: list[FromExecutor]) -> None:
        if executor_id not in self._connections:
            return  # already reported gone: its late messages are not wanted
        for message in messages:
            if isinstance(message, ExecutorHeartbeat):
                self.heartbeat_seen(executor_id)
                break
        self._listener.executor_messages(executor_id, messages)

    def _gone(self, executor_id: str, reason: str) -> None:
        connection = self._connections.pop(executor_id, None)
        if connection is None:
            return
        if connection.transport is not None:
            connection.transport.abort()
        process = self._processes.get(executor_id)
        if process is not None:
            # A dropped connection with a live process: make sure it is gone too.
            signal_child(process.proc)
        if executor_id in self._retired:
            self._retired.discard(executor_id)
            self._listener.executor_gone(executor_id, "retired")
        elif not self._closing:
            log.warning("executor %s gone: %s", executor_id, reason)
            self._listener.executor_gone(executor_id, reason)
