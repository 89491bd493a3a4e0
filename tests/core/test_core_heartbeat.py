"""WorkerHeartbeat: the JSON value a Worker publishes under ``prefix + workerAddr``."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.heartbeat import (
    InvalidHeartbeat,
    WorkerHeartbeat,
    decode_heartbeat,
    encode_heartbeat,
)

WIRE_KEYS = {
    "workerAddr",
    "taskSlots",
    "reservedSlots",
    "runningTasks",
    "cpuPercent",
    "memoryPercent",
    "memoryAvailableBytes",
    "memoryTotalBytes",
    "processRssBytes",
    "errorRate",
    "lastHeartbeatMs",
}

FULL = WorkerHeartbeat(
    worker_addr="10.0.0.1:7000",
    task_slots=8,
    reserved_slots=2,
    running_tasks=3,
    cpu_percent=0.25,
    memory_percent=0.5,
    memory_available_bytes=1 << 30,
    memory_total_bytes=1 << 34,
    process_rss_bytes=123_456,
    error_rate=0.125,
    last_heartbeat_ms=1_700_000_000_000,
)

FULL_JSON: dict[str, Any] = {
    "workerAddr": "10.0.0.1:7000",
    "taskSlots": 8,
    "reservedSlots": 2,
    "runningTasks": 3,
    "cpuPercent": 0.25,
    "memoryPercent": 0.5,
    "memoryAvailableBytes": 1 << 30,
    "memoryTotalBytes": 1 << 34,
    "processRssBytes": 123_456,
    "errorRate": 0.125,
    "lastHeartbeatMs": 1_700_000_000_000,
}

MINIMAL: dict[str, Any] = {"workerAddr": "w:1", "taskSlots": 4, "lastHeartbeatMs": 7}


def _raw(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_encode_uses_exactly_the_camel_case_wire_keys() -> None:
    encoded = json.loads(encode_heartbeat(FULL))
    assert set(encoded) == WIRE_KEYS
    assert encoded == FULL_JSON


def test_decode_of_wire_json_gives_the_struct() -> None:
    assert decode_heartbeat(_raw(FULL_JSON)) == FULL


@pytest.mark.parametrize("as_str", [False, True])
def test_round_trip(as_str: bool) -> None:
    raw = encode_heartbeat(FULL)
    assert decode_heartbeat(raw.decode() if as_str else raw) == FULL


@given(
    addr=st.text(min_size=1, max_size=20),
    counts=st.lists(st.integers(min_value=0, max_value=2**62), min_size=6, max_size=6),
    fractions=st.lists(
        st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=3, max_size=3
    ),
    last=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_round_trip_property(
    addr: str, counts: list[int], fractions: list[float], last: int
) -> None:
    hb = WorkerHeartbeat(
        worker_addr=addr,
        task_slots=counts[0],
        reserved_slots=counts[1],
        running_tasks=counts[2],
        memory_available_bytes=counts[3],
        memory_total_bytes=counts[4],
        process_rss_bytes=counts[5],
        cpu_percent=fractions[0],
        memory_percent=fractions[1],
        error_rate=fractions[2],
        last_heartbeat_ms=last,
    )
    assert decode_heartbeat(encode_heartbeat(hb)) == hb


OPTIONAL_DEFAULTS = [
    ("reservedSlots", "reserved_slots", 0),
    ("runningTasks", "running_tasks", 0),
    ("cpuPercent", "cpu_percent", 0.0),
    ("memoryPercent", "memory_percent", 0.0),
    ("memoryAvailableBytes", "memory_available_bytes", 0),
    ("memoryTotalBytes", "memory_total_bytes", 0),
    ("processRssBytes", "process_rss_bytes", 0),
    ("errorRate", "error_rate", 0.0),
]


@pytest.mark.parametrize(("wire_key", "attr", "default"), OPTIONAL_DEFAULTS)
def test_optional_keys_default_to_zero(wire_key: str, attr: str, default: float) -> None:
    full = dict(FULL_JSON)
    del full[wire_key]
    hb = decode_heartbeat(_raw(full))
    assert getattr(hb, attr) == default
    # The other fields still come through.
    assert hb.worker_addr == FULL.worker_addr
    assert hb.last_heartbeat_ms == FULL.last_heartbeat_ms


def test_minimal_heartbeat_has_all_optional_fields_zero() -> None:
    hb = decode_heartbeat(_raw(MINIMAL))
    assert hb == WorkerHeartbeat(worker_addr="w:1", task_slots=4, last_heartbeat_ms=7)
    for _, attr, default in OPTIONAL_DEFAULTS:
        assert getattr(hb, attr) == default


def test_unknown_keys_are_ignored() -> None:
    raw = _raw({**FULL_JSON, "futureField": {"x": [1, 2]}, "worker_addr": "snake-ignored"})
    assert decode_heartbeat(raw) == FULL


def test_snake_case_keys_are_not_the_wire_format() -> None:
    # Only camelCase keys are read: snake_case required keys count as missing.
    raw = _raw({"worker_addr": "w:1", "task_slots": 4, "last_heartbeat_ms": 7})
    with pytest.raises(InvalidHeartbeat):
        decode_heartbeat(raw)


_DROP = object()


def _with(**changes: Any) -> bytes:
    obj = dict(FULL_JSON)
    for key, value in changes.items():
        if value is _DROP:
            del obj[key]
        else:
            obj[key] = value
    return _raw(obj)


INVALID = [
    # (id, raw)
    ("empty-bytes", b""),
    ("not-json", b"not json"),
    ("truncated", encode_heartbeat(FULL)[:-1]),
    ("array", b"[]"),
    ("null", b"null"),
    ("number", b"42"),
    ("string", b'"w:1"'),
    ("empty-object", b"{}"),
    ("missing-workerAddr", _with(workerAddr=_DROP)),
    ("missing-taskSlots", _with(taskSlots=_DROP)),
    ("missing-lastHeartbeatMs", _with(lastHeartbeatMs=_DROP)),
    ("empty-workerAddr", _with(workerAddr="")),
    ("workerAddr-not-string", _with(workerAddr=1)),
    ("workerAddr-null", _with(workerAddr=None)),
    ("negative-taskSlots", _with(taskSlots=-1)),
    ("negative-reservedSlots", _with(reservedSlots=-1)),
    ("negative-runningTasks", _with(runningTasks=-1)),
    ("negative-memoryAvailableBytes", _with(memoryAvailableBytes=-1)),
    ("negative-memoryTotalBytes", _with(memoryTotalBytes=-1)),
    ("negative-processRssBytes", _with(processRssBytes=-1)),
    ("taskSlots-float", _with(taskSlots=1.5)),
    ("taskSlots-bool", _with(taskSlots=True)),
    ("taskSlots-string", _with(taskSlots="4")),
    ("lastHeartbeatMs-string", _with(lastHeartbeatMs="7")),
    ("cpuPercent-negative", _with(cpuPercent=-0.01)),
    ("cpuPercent-above-one", _with(cpuPercent=1.01)),
    ("cpuPercent-as-percent", _with(cpuPercent=90)),
    ("memoryPercent-negative", _with(memoryPercent=-0.5)),
    ("memoryPercent-above-one", _with(memoryPercent=1.0000001)),
    ("errorRate-negative", _with(errorRate=-1e-9)),
    ("errorRate-above-one", _with(errorRate=2.0)),
]


@pytest.mark.parametrize("raw", [raw for _, raw in INVALID], ids=[i for i, _ in INVALID])
def test_decode_rejects_invalid_values(raw: bytes) -> None:
    with pytest.raises(InvalidHeartbeat):
        decode_heartbeat(raw)


def test_invalid_heartbeat_is_a_value_error_not_a_msgspec_error() -> None:
    with pytest.raises(InvalidHeartbeat) as info:
        decode_heartbeat(_with(taskSlots=-1))
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, msgspec.DecodeError)
    assert "taskSlots" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cpuPercent", 0.0),
        ("cpuPercent", 1.0),
        ("memoryPercent", 0.0),
        ("memoryPercent", 1.0),
        ("errorRate", 0.0),
        ("errorRate", 1.0),
        ("cpuPercent", 1),  # JSON integer for a float field
    ],
)
def test_fraction_bounds_are_inclusive(key: str, value: float) -> None:
    hb = decode_heartbeat(_with(**{key: value}))
    assert getattr(hb, _snake(key)) == value


def _snake(camel: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in camel)


def test_zero_task_slots_and_negative_heartbeat_time_are_accepted() -> None:
    hb = decode_heartbeat(_with(taskSlots=0, lastHeartbeatMs=-5))
    assert hb.task_slots == 0
    assert hb.last_heartbeat_ms == -5


CAPACITY = [
    # (task_slots, reserved, running, used_total, free_capacity)
    (4, 0, 0, 0, 4),
    (4, 1, 2, 3, 1),
    (4, 2, 2, 4, 0),
    (4, 3, 3, 6, -2),
    (0, 0, 0, 0, 0),
    (0, 1, 0, 1, -1),
]


@pytest.mark.parametrize(("slots", "reserved", "running", "used", "free"), CAPACITY)
def test_used_total_and_free_capacity(
    slots: int, reserved: int, running: int, used: int, free: int
) -> None:
    hb = WorkerHeartbeat(
        worker_addr="w:1",
        task_slots=slots,
        reserved_slots=reserved,
        running_tasks=running,
        last_heartbeat_ms=0,
    )
    assert hb.used_total == used
    assert hb.free_capacity == free


def test_heartbeat_is_frozen() -> None:
    with pytest.raises(AttributeError):
        FULL.task_slots = 1  # type: ignore[misc]
