"""A partitionable link made of TCP proxies, where network namespaces are not to be had.

``LinkProxy`` relays ``listen`` to ``target``. ``partition`` plays a pulled cable:
connections stay open but no byte crosses in either direction, and new
connections are accepted and then hang (their upstream is not dialled); ``heal``
lets the held bytes through and dials the held connections, as TCP does once a
link comes back. Nothing is reset: the peers only see silence, as with a veth
that is down.

``ProxyLinks`` groups the proxies of one host (its server port, its etcd
connection) so that the host is cut from everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class LinkProxy:
    """A TCP relay from ``listen_host:listen_port`` to ``target_host:target_port``."""

    def __init__(
        self, listen_host: str, listen_port: int, target_host: str, target_port: int
    ) -> None:
        self.listen_host = listen_host
        self.listen_port = listen_port
        self._target = (target_host, target_port)
        self._up = asyncio.Event()
        self._up.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.listen_port, reuse_address=True
        )

    def partition(self) -> None:
        self._up.clear()

    def heal(self) -> None:
        self._up.set()

    async def close(self) -> None:
        self._up.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A task of our own: close() cancels it, never asyncio's callback task.
        self._spawn(self._connect(reader, writer))

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        await self._up.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        self._spawn(self._pump(reader, up_writer))
        self._spawn(self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._up.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            # One side ended: end the other, as the far end's FIN or RST would.
            with contextlib.suppress(OSError):
                writer.transport.abort()
            self._writers.discard(writer)


class ProxyLinks:
    """The proxies that carry one host's traffic, cut and healed together."""

    def __init__(self) -> None:
        self._by_host: dict[str, list[LinkProxy]] = {}

    async def add(self, host: str, proxy: LinkProxy) -> LinkProxy:
        await proxy.start()
        self._by_host.setdefault(host, []).append(proxy)
        return proxy

    def cut(self, host: str) -> None:
        for proxy in self._by_host.get(host, []):
            proxy.partition()

    def heal(self, host: str) -> None:
        for proxy in self._by_host.get(host, []):
            proxy.heal()

    async def close(self) -> None:
        for proxies in self._by_host.values():
            for proxy in proxies:
                await proxy.close()
        self._by_host.clear()
