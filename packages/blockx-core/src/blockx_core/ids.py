"""Identifier aliases used across the core (plain strings on the wire)."""

from __future__ import annotations

from typing import TypeAlias

TaskId: TypeAlias = str
"""Client-generated idempotency key of a task (uuid4 recommended)."""

WorkerAddr: TypeAlias = str
"""``host:port`` a Worker serves ``worker.v1.WorkerService`` on; its identity in etcd."""

SlotId: TypeAlias = str
"""Opaque slot handle issued by a Worker; the Coordinator never interprets it."""

MAX_TASK_ID_BYTES = 256
"""The longest task_id accepted (in UTF-8 bytes): a uuid4 is 36, a retry lineage adds
a few more; anything longer is a mistake or an attack on memory and logs."""

MAX_WATCH_TASK_IDS = 10_000
"""The most task_ids one WatchTasks stream may follow."""

SHOWN_BYTES = 128
"""No message echoes more than this much of a value it refuses."""


def shown(value: str, limit: int = SHOWN_BYTES) -> str:
    """``value`` for a message: quoted, and cut after ``limit`` UTF-8 bytes."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return repr(value)
    head = raw[:limit].decode("utf-8", "ignore")
    return f"{head!r}… ({len(raw)} bytes)"


def task_id_problem(task_id: str, field: str = "task_id") -> str | None:
    """Why ``task_id`` cannot be used, or None: it must be non-empty and at most
    MAX_TASK_ID_BYTES long."""
    if not task_id:
        return f"{field} is required"
    size = len(task_id.encode("utf-8", "surrogatepass"))
    if size > MAX_TASK_ID_BYTES:
        return f"{field} is {size} bytes long; at most {MAX_TASK_ID_BYTES} are accepted"
    return None
