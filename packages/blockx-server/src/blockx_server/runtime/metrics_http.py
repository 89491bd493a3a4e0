"""A minimal Prometheus scrape endpoint on the process's own event loop.

``BLOCKX_PROMETHEUS_LISTEN_ADDR`` / ``BLOCKX_PROMETHEUS_PATH``. prometheus_client's
own server runs in a thread and answers on every path; this answers GET on the
configured path only, and 404 elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 16 * 1024


async def start_metrics_server(
    registry: CollectorRegistry, listen: tuple[str, int] | None, path: str
) -> asyncio.Server | None:
    """Serve ``registry`` on ``listen`` (host, port); None = metrics are off."""
    if listen is None:
        return None
    host, port = listen

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > _MAX_HEADER_BYTES:
                raise ValueError("request head too large")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method not in ("GET", "HEAD"):
                status, body, ctype = "405 Method Not Allowed", b"", "text/plain"
            elif target.split("?", 1)[0] != path:
                status, body, ctype = "404 Not Found", b"not found\n", "text/plain"
            else:
                status, body, ctype = "200 OK", generate_latest(registry), CONTENT_TYPE_LATEST
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, ConnectionError):
            pass  # a broken or slow scraper is its own problem
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host or None, port)
    bound = server.sockets[0].getsockname()
    log.info("metrics on http://%s:%s%s", bound[0], bound[1], path)
    return server
