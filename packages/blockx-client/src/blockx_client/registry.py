"""The worker registry as an operator sees it, read from etcd's JSON gateway.

No etcd client library is needed: etcd serves its v3 KV API as JSON over HTTP
(``POST /v3/kv/range``), which is all a read-only view needs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request

import msgspec

from blockx_client.errors import ConnectError


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A worker's heartbeat (the registry's JSON value) and where it was found."""

    worker_addr: str
    task_slots: int = 0
    reserved_slots: int = 0
    running_tasks: int = 0
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


def _fetch(endpoint: str, prefix: str, timeout_s: float) -> list[WorkerInfo]:
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    body = json.dumps(
        {"key": _b64(prefix.encode()), "range_end": _b64(_range_end(prefix.encode()))}
    ).encode()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v3/kv/range", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        data = json.loads(response.read())
    workers = []
    for kv in data.get("kvs", []):
        try:
            info = msgspec.json.decode(base64.b64decode(kv["value"]), type=WorkerInfo)
        except (msgspec.DecodeError, KeyError, ValueError):
            continue  # not a heartbeat: the coordinators skip it too
        workers.append(msgspec.structs.replace(info, prefix=prefix))
    return workers


async def list_workers(
    endpoints: list[str], prefixes: list[str], *, timeout_s: float = 5.0
) -> list[WorkerInfo]:
    """Every worker registered under ``prefixes``, from the first endpoint that answers."""
    errors = []
    for endpoint in endpoints:
        try:
            found: list[WorkerInfo] = []
            for prefix in prefixes:
                found += await asyncio.to_thread(_fetch, endpoint, prefix, timeout_s)
            return sorted(found, key=lambda w: (w.prefix, w.worker_addr))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            errors.append(f"{endpoint}: {exc}")
    raise ConnectError("cannot read the registry from etcd (" + "; ".join(errors) + ")")
