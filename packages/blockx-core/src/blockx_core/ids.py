"""Identifier aliases used across the core (plain strings on the wire)."""

from __future__ import annotations

from typing import TypeAlias

TaskId: TypeAlias = str
"""Client-generated idempotency key of a task (uuid4 recommended)."""

WorkerAddr: TypeAlias = str
"""``host:port`` a Worker serves ``worker.v1.WorkerService`` on; its identity in etcd."""

SlotId: TypeAlias = str
"""Opaque slot handle issued by a Worker; the Coordinator never interprets it."""
