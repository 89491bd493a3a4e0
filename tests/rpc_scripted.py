"""A scripted JSON-RPC server for tests about the client's side: a real HTTP/1.1
socket on 127.0.0.1 whose answers a test decides (status, body), keep-alive included.

``handler(request_json) -> (status, body_bytes)`` sees each HTTP request's decoded
JSON (an object or a batch list); ``requests`` records them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any], Awaitable[tuple[int, bytes]]]


def answer(request: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def error(request: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": code, "message": message}}


def each(request: Any, one: Callable[[dict[str, Any]], dict[str, Any]]) -> bytes:
    """The JSON answer to an object or a batch, ``one`` answering each request."""
    if isinstance(request, list):
        return json.dumps([one(r) for r in request]).encode()
    return json.dumps(one(request)).encode()


class ScriptedRpcServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Any] = []
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    async def __aenter__(self) -> ScriptedRpcServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        # Keep-alive connections end here, not when the test's loop is torn down.
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                request = json.loads(await reader.readexactly(length))
                self.requests.append(request)
                status, body = await self.handler(request)
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.pop(task, None)
            writer.close()
