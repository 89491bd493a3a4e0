"""The heartbeat a Worker publishes in etcd under ``registry prefix + workerAddr``."""

from __future__ import annotations

from typing import Annotated

import msgspec

# Integers are int64 on the wire (the Go struct's types); larger values are invalid.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# Named "percent" for wire compatibility, but a fraction in [0, 1].
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class WorkerHeartbeat(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """JSON value of a registry key. The keys are part of the wire contract.

    ``lastHeartbeatMs`` is Unix milliseconds on the Worker's clock; the Coordinator
    judges freshness against its own clock. ``memoryAvailableBytes`` is parsed but
    takes no part in placement.
    """

    worker_addr: Annotated[str, msgspec.Meta(min_length=1)]
    task_slots: NonNegativeInt
    reserved_slots: NonNegativeInt = 0
    running_tasks: NonNegativeInt = 0
    cpu_percent: Fraction = 0.0
    memory_percent: Fraction = 0.0
    memory_available_bytes: NonNegativeInt = 0
    memory_total_bytes: NonNegativeInt = 0
    process_rss_bytes: NonNegativeInt = 0
    error_rate: Fraction = 0.0
    last_heartbeat_ms: Int64

    @property
    def used_total(self) -> int:
        return self.reserved_slots + self.running_tasks

    @property
    def free_capacity(self) -> int:
        return self.task_slots - self.used_total


class InvalidHeartbeat(ValueError):
    """A registry value that is not a valid heartbeat (skipped and logged by callers)."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(WorkerHeartbeat)


def encode_heartbeat(heartbeat: WorkerHeartbeat) -> bytes:
    return _encoder.encode(heartbeat)


def decode_heartbeat(raw: bytes | str) -> WorkerHeartbeat:
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidHeartbeat(str(exc)) from None
