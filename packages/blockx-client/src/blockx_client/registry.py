"""The worker registry as an operator sees it, read from etcd's JSON gateway
(``_etcd_gateway``): every heartbeat under the registry prefixes."""

from __future__ import annotations

import msgspec

from blockx_client._etcd_gateway import EtcdAccess, Gateway, first_answer
from blockx_client.errors import ConnectError
from blockx_core.heartbeat import InvalidHeartbeat, WorkerHeartbeat, decode_heartbeat

__all__ = ["EtcdAccess", "RegisteredWorker", "list_workers"]


class RegisteredWorker(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's heartbeat, as the Coordinators read it, and the registry prefix it
    was found under."""

    prefix: str
    heartbeat: WorkerHeartbeat


def _fetch(gateway: Gateway, prefixes: list[str]) -> list[RegisteredWorker]:
    workers = []
    for prefix in prefixes:
        for _key, value in gateway.range_prefix(prefix):
            try:
                heartbeat = decode_heartbeat(value)
            except InvalidHeartbeat:
                continue  # not a heartbeat: the coordinators skip it too
            workers.append(RegisteredWorker(prefix=prefix, heartbeat=heartbeat))
    return workers


async def list_workers(
    endpoints: list[str],
    prefixes: list[str],
    *,
    timeout_s: float = 5.0,
    access: EtcdAccess | None = None,
) -> list[RegisteredWorker]:
    """Every worker registered under ``prefixes``, from the first endpoint that answers.

    ``access`` (TLS and credentials) defaults to ``EtcdAccess.from_environ()``."""
    try:
        found = await first_answer(
            endpoints, access, timeout_s, lambda gateway: _fetch(gateway, prefixes)
        )
    except ConnectError as exc:
        raise ConnectError(f"cannot read the registry from etcd ({exc})") from None
    return sorted(found, key=lambda w: (w.prefix, w.heartbeat.worker_addr))
