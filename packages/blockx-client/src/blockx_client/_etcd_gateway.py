"""etcd's v3 API as JSON over HTTP (its gRPC gateway), for the SDK.

No etcd client library is needed: etcd serves ``POST /v3/kv/range`` as JSON,
which is all the SDK's registry view needs (the SDK only reads etcd). With
``EtcdAccess`` the gateway is dialled over HTTPS (the CA verifies etcd, a client
certificate answers ``--client-cert-auth``) and, with a username,
``POST /v3/auth/authenticate`` gets a token that every call sends in its
``Authorization`` header. The calls block; callers run them in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from blockx_client.errors import ConnectError, InvalidRequestError
from blockx_core.addr import etcd_host_port

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class EtcdAccess:
    """TLS and credentials for etcd, the ``ETCD_*`` variables the servers read.

    ``ca_file`` turns TLS on; ``cert_file`` and ``key_file`` present a client
    certificate; ``username`` and ``password`` authenticate, only over TLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.password is not None and self.ca_file is None:
            raise InvalidRequestError("ETCD_PASSWORD is only sent over TLS: set ETCD_CA_FILE too")
        if (self.username is None) != (self.password is None):
            raise InvalidRequestError("ETCD_USERNAME and ETCD_PASSWORD must be set together")
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidRequestError("ETCD_CERT_FILE and ETCD_KEY_FILE must be set together")
        if self.cert_file is not None and self.ca_file is None:
            raise InvalidRequestError("ETCD_CERT_FILE needs ETCD_CA_FILE (TLS) too")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> EtcdAccess:
        """The ``ETCD_CA_FILE``, ``ETCD_CERT_FILE``, ``ETCD_KEY_FILE``, ``ETCD_USERNAME``
        and ``ETCD_PASSWORD`` variables (unset or blank: not used)."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            return env.get(name, "").strip() or None

        return cls(
            ca_file=get("ETCD_CA_FILE"),
            cert_file=get("ETCD_CERT_FILE"),
            key_file=get("ETCD_KEY_FILE"),
            username=get("ETCD_USERNAME"),
            password=env.get("ETCD_PASSWORD") or None,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequestError(f"cannot load the etcd TLS files: {exc}") from None
        return context


class Refused(Exception):
    """etcd answered, and refused the request."""


class Gateway:
    """One etcd endpoint's JSON gateway (``host[:port]``, port 2379 when left out,
    an ``http://`` or ``https://`` scheme ignored: ``access`` decides TLS),
    authenticated on first use."""

    def __init__(self, endpoint: str, access: EtcdAccess, *, timeout_s: float = 5.0) -> None:
        scheme = "http" if access.ca_file is None else "https"
        self.base_url = f"{scheme}://{etcd_host_port(endpoint)}"
        self._access = access
        self._context = access.ssl_context()
        self._timeout_s = timeout_s
        self._token: str | None = None
        self._authenticated = False

    def range_prefix(self, prefix: str) -> list[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with ``prefix``."""
        key = prefix.encode()
        data = self._call("/v3/kv/range", {"key": _b64(key), "range_end": _b64(_range_end(key))})
        return [
            (base64.b64decode(kv["key"]), base64.b64decode(kv.get("value", "")))
            for kv in data.get("kvs", [])
        ]

    def _call(self, path: str, body: dict[str, str]) -> Any:
        if not self._authenticated:
            self._token = self._authenticate()
            self._authenticated = True
        return _post(self.base_url + path, body, self._context, self._token, self._timeout_s)

    def _authenticate(self) -> str | None:
        access = self._access
        if access.username is None or access.password is None:
            return None
        try:
            reply = _post(
                f"{self.base_url}/v3/auth/authenticate",
                {"name": access.username, "password": access.password},
                self._context,
                None,
                self._timeout_s,
            )
        except Refused as exc:
            raise Refused(
                f"etcd refused user {access.username!r} (ETCD_USERNAME / ETCD_PASSWORD): {exc}"
            ) from None
        token = reply.get("token") if isinstance(reply, dict) else None
        if not isinstance(token, str):
            raise Refused("etcd's authenticate answer has no token")
        return token


async def first_answer(
    endpoints: list[str],
    access: EtcdAccess | None,
    timeout_s: float,
    read: Callable[[Gateway], T],
) -> T:
    """``read`` against the first of ``endpoints`` that answers, in a thread.

    ``access`` defaults to ``EtcdAccess.from_environ()``. Raises ConnectError naming
    every endpoint's failure when none answers."""
    access = EtcdAccess.from_environ() if access is None else access

    def attempt(endpoint: str) -> T:
        return read(Gateway(endpoint, access, timeout_s=timeout_s))

    errors = []
    for endpoint in endpoints:
        try:
            return await asyncio.to_thread(attempt, endpoint)
        except (Refused, OSError, urllib.error.URLError, ValueError) as exc:
            # urllib wraps a refused connection as "<urlopen error [Errno 111] ...>".
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            errors.append(f"{endpoint}: {reason}")
    raise ConnectError("; ".join(errors) or "no etcd endpoint given")


def _range_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    end[-1] += 1
    return bytes(end)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _post(
    url: str,
    body: dict[str, str],
    context: ssl.SSLContext | None,
    token: str | None,
    timeout_s: float,
) -> Any:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = token
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        # etcd's gateway explains a refusal in a JSON body: say that, not "HTTP Error 401".
        try:
            detail = json.loads(exc.read()).get("message") or exc.reason
        except (ValueError, AttributeError, OSError):
            detail = exc.reason
        raise Refused(f"etcd answered {exc.code}: {detail}") from None
