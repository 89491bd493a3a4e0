"""The dashboard's web application (Starlette): one HTML page and one JSON twin
(``/api/...``) per view, static files, and nothing that changes anything.

Read-only by construction: every request whose method is not GET or HEAD is 405
before it reaches a route. Templates autoescape every value (task ids and failure
messages are whatever a client or a function put there), and a Content Security
Policy allows only the dashboard's own script and style, so an injected element
could not run even if one got through. Query parameters are bounded; a bad one is
400 naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import jinja2
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.formatting import FILTERS
from blockx_cli.dashboard.jobs_source import jobs_page
from blockx_cli.dashboard.sources import LISTED_STATES, ClusterSource
from blockx_client import Client, Cluster

_HERE: Final = Path(__file__).parent
MAX_TEXT: Final = 200
MAX_TASK_ID: Final = 512
MAX_ADDR: Final = 300
# The last ms of year 9999: the latest time a page can show.
MAX_UNIX_MS: Final = 253_402_300_799_999
DEFAULT_LIMIT: Final = 500
MAX_LIMIT: Final = 5_000
_HEADERS: Final = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def _host_name(scope: Scope) -> str:
    """The Host header's name without its port (``[::1]:8941`` is ``::1``)."""
    host = ""
    for name, value in scope.get("headers", []):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            break
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class ReadOnly:
    """405 for every method but GET and HEAD, 400 for a Host not allowed; the
    security headers on every answer."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts and _host_name(scope) not in self.allowed_hosts:
            refusal = Response(
                "this dashboard answers only requests addressed to "
                + ", ".join(sorted(self.allowed_hosts))
                + "\n",
                status_code=400,
                media_type="text/plain",
            )
            await refusal(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            refusal = Response(
                "the dashboard is read-only: GET and HEAD only\n",
                status_code=405,
                headers={"Allow": "GET, HEAD"},
                media_type="text/plain",
            )
            await refusal(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class BadParameter(Exception):
    """A query parameter out of bounds; ``str()`` says which and why."""


def _text(request: Request, name: str, bound: int = MAX_TEXT) -> str:
    value = request.query_params.get(name, "").strip()
    if len(value) > bound:
        raise BadParameter(f"{name} is longer than {bound} characters")
    return value


def _state(request: Request) -> str:
    value = _text(request, "state").upper()
    if value and value not in LISTED_STATES:
        raise BadParameter(f"state must be one of {', '.join(LISTED_STATES)} (or empty)")
    return value


def _limit(request: Request) -> int:
    raw = _text(request, "limit", 8) or str(DEFAULT_LIMIT)
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise BadParameter(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return int(raw)


def _cluster(request: Request) -> Cluster:
    value = _text(request, "cluster", 8).lower() or Cluster.BLOCK.value
    try:
        return Cluster(value)
    except ValueError:
        raise BadParameter("cluster must be block or bundle") from None


def _unix_ms(request: Request, name: str) -> int:
    raw = _text(request, name, 16) or "0"
    if not raw.isdigit() or int(raw) > MAX_UNIX_MS:
        raise BadParameter(f"{name} must be a time in Unix milliseconds (0: no bound)")
    return int(raw)


def _worker_addr(request: Request) -> str:
    value = _text(request, "addr", MAX_ADDR)
    if not value:
        raise BadParameter(
            "addr (the worker's host:port, as the Workers page lists it) is required"
        )
    return value


def _task_id(request: Request) -> str:
    value = request.query_params.get("id", "")
    if not value:
        raise BadParameter("id (the task id) is required")
    if len(value) > MAX_TASK_ID:
        raise BadParameter(f"id is longer than {MAX_TASK_ID} characters")
    return value


Page = Callable[[Request], Awaitable[msgspec.Struct]]


class Dashboard:
    """The routes over one ``ClusterSource``; ``app`` is the ASGI application."""

    def __init__(self, config: DashboardConfig, client_factory: Callable[[], Client]) -> None:
        self.config = config
        self._client_factory = client_factory
        self._source: ClusterSource | None = None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(FILTERS)
        pages: dict[str, tuple[str, Page]] = {
            "workers": ("workers.html", self._workers),
            "worker": ("worker.html", self._worker),
            "tasks": ("tasks.html", self._tasks),
            "task": ("task.html", self._task),
            "placement": ("placement.html", self._placement),
            "jobs": ("jobs.html", self._jobs),
        }
        routes: list[Route | Mount] = [Route("/", self._home)]
        for name, (template, page) in pages.items():
            routes.append(Route(f"/{name}", self._html(name, template, page), name=name))
            routes.append(Route(f"/api/{name}", self._json(page), name=f"api_{name}"))
        routes.append(Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"))
        self.app = ReadOnly(
            Starlette(
                routes=routes,
                lifespan=self._lifespan,
                exception_handlers={HTTPException: self._http_error, Exception: self._crashed},
            ),
            config.allowed_hosts,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        async with self._client_factory() as client:
            self._source = ClusterSource(self.config, client)
            yield
        self._source = None

    @property
    def source(self) -> ClusterSource:
        assert self._source is not None, "the dashboard serves only inside its lifespan"
        return self._source

    # ---- the pages -------------------------------------------------------------------

    async def _workers(self, _request: Request) -> msgspec.Struct:
        return await self.source.workers()

    async def _worker(self, request: Request) -> msgspec.Struct:
        return await self.source.worker(_worker_addr(request))

    async def _tasks(self, request: Request) -> msgspec.Struct:
        since_ms, until_ms = _unix_ms(request, "since"), _unix_ms(request, "until")
        if until_ms and since_ms > until_ms:
            raise BadParameter("since is after until: no task was first seen in between")
        return await self.source.tasks(
            state=_state(request),
            function=_text(request, "function"),
            q=_text(request, "q"),
            limit=_limit(request),
            since_ms=since_ms,
            until_ms=until_ms,
        )

    async def _task(self, request: Request) -> msgspec.Struct:
        return await self.source.task(_task_id(request))

    async def _placement(self, request: Request) -> msgspec.Struct:
        return await self.source.placement(_cluster(request))

    async def _jobs(self, _request: Request) -> msgspec.Struct:
        return await jobs_page(self.config)

    # ---- rendering -------------------------------------------------------------------

    def _render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            refresh_s=self.config.refresh_s, **context
        )
        return HTMLResponse(html, status_code=status)

    def _html(
        self, name: str, template: str, page: Page
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                view = await page(request)
            except BadParameter as exc:
                return self._render(
                    "error.html", 400, page=name, title="Bad request", detail=str(exc)
                )
            api = f"/api/{name}" + (f"?{request.url.query}" if request.url.query else "")
            return self._render(template, page=name, view=view, api=api)

        return endpoint

    def _json(self, page: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                view = await page(request)
            except BadParameter as exc:
                body = msgspec.json.encode({"error": str(exc)})
                return Response(body, status_code=400, media_type="application/json")
            return Response(msgspec.json.encode(view), media_type="application/json")

        return endpoint

    async def _home(self, _request: Request) -> Response:
        return RedirectResponse("/workers", status_code=302)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        title = "Not found" if exc.status_code == 404 else "Refused"
        return self._render(
            "error.html", exc.status_code, page="", title=title, detail=f"{request.url.path}"
        )

    async def _crashed(self, _request: Request, exc: Exception) -> Response:
        # The cause goes to the server's log; the page names its kind only.
        return self._render(
            "error.html",
            500,
            page="",
            title="The dashboard failed on this page",
            detail=f"{type(exc).__name__}; the dashboard's log has the details",
        )


def create_app(
    config: DashboardConfig, client_factory: Callable[[], Client] | None = None
) -> ASGIApp:
    """The dashboard as an ASGI app; ``client_factory`` makes its one ``Client``
    (default: one for ``config``'s coordinator and proxy)."""

    def default_client() -> Client:
        return Client(
            coordinator=config.coordinator,
            bundle_coordinator=config.bundle_coordinator,
            proxy_socket=config.proxy_socket,
            direct=config.direct,
            rpc_timeout_s=config.timeout_s,
        )

    return Dashboard(config, client_factory or default_client).app
