"""Child processes of the local cluster, and how to tell that each is serving."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx_server.runtime.process import signal_child, stopped_with_parent

READY_TIMEOUT_S: Final = 60.0
# A probe of a child not listening yet is a refused connection: cheap enough to
# ask often, so a child is seen serving within this of when it starts to.
_PROBE_PERIOD_S: Final = 0.05


class LaunchError(RuntimeError):
    """The cluster cannot start; ``str()`` is the one line users see."""


def console_script(program: str) -> str | None:
    """The console script ``program`` of this installation, else the one on PATH.

    The scripts of one environment sit next to its interpreter (``.venv/bin``), and
    ``.venv/bin/blockx`` runs without that directory on PATH. ``sys.executable`` is
    not resolved: in a virtual environment it is a link to the base interpreter,
    whose directory holds none of the environment's scripts."""
    sibling = Path(sys.executable).parent / program
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(program)


def child_environ(env: Mapping[str, str], unset: Collection[str] = ()) -> dict[str, str]:
    """What a child started with ``env`` gets: this process's environment, less
    ``unset``, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **env}


class Child:
    """A child process whose output is streamed with a name in front of each line."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: IO[str]) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.pump = asyncio.create_task(self._pump())

    @classmethod
    async def start(
        cls,
        name: str,
        program: str,
        env: dict[str, str],
        log: IO[str],
        args: Sequence[str] = (),
        *,
        unset: Collection[str] = (),
    ) -> Child:
        """``program`` with this process's environment, less ``unset``, plus ``env``."""
        binary = console_script(program)
        if binary is None:
            raise LaunchError(f"{program} is not installed; run `uv sync` at the repository root")
        proc = await asyncio.create_subprocess_exec(
            binary,
            *args,
            env=child_environ(env, unset),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Ctrl-C at a terminal signals the whole foreground process group: only
            # the launcher should get it, so it stops the children in order.
            start_new_session=True,
            # A launcher killed outright (SIGKILL, OOM) leaves no cluster behind.
            preexec_fn=stopped_with_parent(),
        )
        return cls(name, proc, log)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            print(
                f"[{self.name}] {line.decode(errors='replace').rstrip()}", file=self.log, flush=True
            )

    async def stop(self) -> None:
        if self.proc.returncode is None:
            signal_child(self.proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except TimeoutError:
                signal_child(self.proc)
                await self.proc.wait()
        await self.pump


async def wait_serving(child: Child, what: str, probe: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``probe`` until it says yes; LaunchError if the child exits or time runs out."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not await probe():
        if child.proc.returncode is not None:
            raise LaunchError(f"the {what} exited with code {child.proc.returncode}")
        if time.monotonic() > deadline:
            raise LaunchError(f"the {what} did not become ready in time")
        await asyncio.sleep(_PROBE_PERIOD_S)


def grpc_serving(port: int, service: str) -> Callable[[], Awaitable[bool]]:
    """A probe: grpc.health.v1 on 127.0.0.1:``port`` says SERVING for ``service``."""

    async def probe() -> bool:
        channel = Channel("127.0.0.1", port)
        try:
            reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=2)
        except (GRPCError, OSError, TimeoutError):
            return False
        finally:
            channel.close()
        return bool(reply.status == HealthCheckResponse.SERVING)

    return probe


def http_serving(port: int, path: str) -> Callable[[], Awaitable[bool]]:
    """A probe: an HTTP GET of ``path`` on 127.0.0.1:``port`` answers 200."""

    async def probe() -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), timeout=2)
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
        return status.split(b" ")[1:2] == [b"200"]

    return probe


def accepting(path: Path) -> Callable[[], Awaitable[bool]]:
    """A probe: something accepts connections on the Unix socket at ``path``."""

    async def probe() -> bool:
        try:
            _, writer = await asyncio.open_unix_connection(str(path))
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    return probe
