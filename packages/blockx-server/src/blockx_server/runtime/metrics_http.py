"""The Prometheus scrape endpoint of every BlockX server process.

``BLOCKX_PROMETHEUS_LISTEN_ADDR`` / ``BLOCKX_PROMETHEUS_PATH``. prometheus_client's
WSGI app answers: it negotiates the exposition format from ``Accept`` (OpenMetrics
for ``application/openmetrics-text``, the Prometheus text format otherwise), gzips
when asked, and filters on ``?name[]=``. The standard library's threaded WSGI
server carries it, so HTTP parsing is ``http.server``'s: a request head past its
bounds (a line over 64 KiB, more than 100 header lines) is answered 414 or 431 and
that connection closed, and the server goes on serving. A client gets
``REQUEST_TIMEOUT_S`` per read before its connection is dropped.

The scrape itself runs on the process's event loop: the collectors read the live
state of the core, the slot table and the executor pool, which only the loop's
thread touches. GET and HEAD on the configured path only; 404 elsewhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S: Final = 10.0
# How long a scrape waits for the event loop before it answers 503.
RENDER_TIMEOUT_S: Final = 10.0

_Headers = list[tuple[str, str]]
_StartResponse = Callable[..., Any]
_WsgiApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.client_address[0], *args)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scraper never holds the process at exit
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hung up or timed out: its problem, not a traceback on stderr.
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """The running endpoint; ``close()`` then ``await wait_closed()`` stops it."""

    def __init__(self, httpd: _Server) -> None:
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        self._closing = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._closing = True

    async def wait_closed(self) -> None:
        await asyncio.to_thread(self._httpd.shutdown)
        self._httpd.server_close()


async def start_metrics_server(
    registry: CollectorRegistry, listen: tuple[str, int] | None, path: str
) -> MetricsServer | None:
    """Serve ``registry`` on ``listen`` (host, port); None = metrics are off."""
    if listen is None:
        return None
    host, port = listen
    app = _on_loop(make_wsgi_app(registry), asyncio.get_running_loop(), path)
    server_class = _Server6 if ":" in host else _Server
    httpd = server_class((host, port), _Handler)
    httpd.set_app(app)
    server = MetricsServer(httpd)
    bound_host, bound_port = server.address
    log.info("metrics on http://%s:%s%s", bound_host, bound_port, path)
    return server


def _on_loop(inner: _WsgiApp, loop: asyncio.AbstractEventLoop, path: str) -> _WsgiApp:
    """``inner`` on ``path`` only, each call run on ``loop``'s thread."""

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        head = environ.get("REQUEST_METHOD") == "HEAD"
        if head:
            environ = {**environ, "REQUEST_METHOD": "GET"}
        try:
            status, headers, body = _render(inner, environ, loop)
        except (RuntimeError, TimeoutError, concurrent.futures.CancelledError):
            # The loop is stopping, or too busy to answer in time.
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"metrics unavailable\n"]
        except Exception:
            log.exception("collecting the metrics failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"collecting the metrics failed\n"]
        if head:
            start_response(status, [*headers, ("Content-Length", str(len(body)))])
            return []
        start_response(status, headers)
        return [body]

    return app


def _render(
    inner: _WsgiApp, environ: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> tuple[str, _Headers, bytes]:
    answer: concurrent.futures.Future[tuple[str, _Headers, bytes]] = concurrent.futures.Future()

    def render() -> None:
        if not answer.set_running_or_notify_cancel():
            return
        started: list[tuple[str, _Headers]] = []

        def start_response(status: str, headers: _Headers, exc_info: Any = None) -> None:
            started.append((status, list(headers)))

        try:
            body = b"".join(inner(environ, start_response))
            answer.set_result((started[0][0], started[0][1], body))
        except Exception as exc:
            answer.set_exception(exc)

    loop.call_soon_threadsafe(render)  # RuntimeError once the loop is closed
    try:
        return answer.result(RENDER_TIMEOUT_S)
    finally:
        answer.cancel()
