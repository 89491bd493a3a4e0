"""The worker registry as an operator sees it, read from etcd's JSON gateway
(``_etcd_gateway``): every heartbeat under the registry prefixes."""

from __future__ import annotations

import msgspec

from blockx_client._etcd_gateway import EtcdAccess, Gateway, first_answer
from blockx_client.errors import ConnectError

__all__ = ["EtcdAccess", "WorkerInfo", "list_workers"]


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


def _fetch(gateway: Gateway, prefixes: list[str]) -> list[WorkerInfo]:
    workers = []
    for prefix in prefixes:
        for _key, value in gateway.range_prefix(prefix):
            try:
                info = msgspec.json.decode(value, type=WorkerInfo)
            except msgspec.DecodeError:
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
    try:
        found = await first_answer(
            endpoints, access, timeout_s, lambda gateway: _fetch(gateway, prefixes)
        )
    except ConnectError as exc:
        raise ConnectError(f"cannot read the registry from etcd ({exc})") from None
    return sorted(found, key=lambda w: (w.prefix, w.worker_addr))
