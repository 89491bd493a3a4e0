"""The worker registry as an operator sees it, read from etcd's JSON gateway.

No etcd client library is needed: etcd serves its v3 KV API as JSON over HTTP
(``POST /v3/kv/range``), which is all a read-only view needs. With ``EtcdAccess``
the gateway is dialled over HTTPS (the CA verifies etcd, a client certificate
answers ``--client-cert-auth``) and, with a username, ``POST /v3/auth/authenticate``
gets a token that every range sends in its ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from blockx_client.errors import ConnectError, InvalidRequestError


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


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A worker's heartbeat (the registry's JSON value) and where it was found."""

    worker_addr: str
    task_slots: int = 0
    reserved_slots: int = 0
    running_tasks: int = 0
    # Fractions 0..1 despite their names (the heartbeat's cpuPercent and memoryPercent).
    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    memory_available_bytes: int = 0
    memory_total_bytes: int = 0
    process_rss_bytes: int = 0
    error_rate: float = 0.0
    last_heartbeat_ms: int = 0
    prefix: str = ""

    @property
    def used_slots(self) -> int:
        return self.reserved_slots + self.running_tasks


def _range_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    end[-1] += 1
    return bytes(end)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _base_url(endpoint: str, access: EtcdAccess) -> str:
    scheme = "http" if access.ca_file is None else "https"
    if "://" in endpoint:
        endpoint = endpoint.split("://", 1)[1]
    return f"{scheme}://{endpoint.rstrip('/')}"


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
        raise _Refused(f"etcd answered {exc.code}: {detail}") from None


class _Refused(Exception):
    """etcd answered, and refused the request."""


def _token(
    base: str, access: EtcdAccess, context: ssl.SSLContext | None, timeout_s: float
) -> str | None:
    if access.username is None or access.password is None:
        return None
    try:
        reply = _post(
            f"{base}/v3/auth/authenticate",
            {"name": access.username, "password": access.password},
            context,
            None,
            timeout_s,
        )
    except _Refused as exc:
        raise _Refused(
            f"etcd refused user {access.username!r} (ETCD_USERNAME / ETCD_PASSWORD): {exc}"
        ) from None
    token = reply.get("token") if isinstance(reply, dict) else None
    if not isinstance(token, str):
        raise _Refused("etcd's authenticate answer has no token")
    return token


def _fetch(
    endpoint: str, prefixes: list[str], access: EtcdAccess, timeout_s: float
) -> list[WorkerInfo]:
    context = access.ssl_context()
    base = _base_url(endpoint, access)
    token = _token(base, access, context, timeout_s)
    workers: list[WorkerInfo] = []
    for prefix in prefixes:
        workers += _range(base, prefix, context, token, timeout_s)
    return workers


def _range(
    base: str, prefix: str, context: ssl.SSLContext | None, token: str | None, timeout_s: float
) -> list[WorkerInfo]:
    body = {"key": _b64(prefix.encode()), "range_end": _b64(_range_end(prefix.encode()))}
    data = _post(f"{base}/v3/kv/range", body, context, token, timeout_s)
    workers = []
    for kv in data.get("kvs", []):
        try:
            info = msgspec.json.decode(base64.b64decode(kv["value"]), type=WorkerInfo)
        except (msgspec.DecodeError, KeyError, ValueError):
            continue  # not a heartbeat: the coordinators skip it too
        workers.append(msgspec.structs.replace(info, prefix=prefix))
    return workers


async def list_workers(
    endpoints: list[str],
    prefixes: list[str],
    *,
    timeout_s: float = 5.0,
    access: EtcdAccess | None = None,
) -> list[WorkerInfo]:
    """Every worker registered under ``prefixes``, from the first endpoint that answers.

    ``access`` (TLS and credentials) defaults to ``EtcdAccess.from_environ()``."""
    access = EtcdAccess.from_environ() if access is None else access
    errors = []
    for endpoint in endpoints:
        try:
            found = await asyncio.to_thread(_fetch, endpoint, prefixes, access, timeout_s)
            return sorted(found, key=lambda w: (w.prefix, w.worker_addr))
        except (_Refused, OSError, urllib.error.URLError, ValueError) as exc:
            errors.append(f"{endpoint}: {exc}")
    raise ConnectError("cannot read the registry from etcd (" + "; ".join(errors) + ")")
