"""task_id bounds and what a message may echo of a refused value."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.coordinator import validate_reserve_request
from blockx_core.errors import ErrorCode, InvalidConfig
from blockx_core.ids import MAX_TASK_ID_BYTES, SHOWN_BYTES, shown, task_id_problem
from blockx_core.worker import WorkerConfig


@given(st.text(max_size=400))
def test_shown_never_echoes_more_than_its_limit(value: str) -> None:
    text = shown(value)
    if len(value.encode("utf-8", "surrogatepass")) <= SHOWN_BYTES:
        assert text == repr(value)
    else:
        quoted = text.rsplit("… (", 1)[0]
        assert len(ast.literal_eval(quoted).encode("utf-8", "surrogatepass")) <= SHOWN_BYTES


@pytest.mark.parametrize(
    ("task_id", "problem"),
    [
        ("", "task_id is required"),
        ("a" * MAX_TASK_ID_BYTES, None),
        ("a" * (MAX_TASK_ID_BYTES + 1), "task_id is 257 bytes long; at most 256 are accepted"),
        # Bytes, not characters: 129 two-byte characters are over the limit.
        ("é" * 129, "task_id is 258 bytes long; at most 256 are accepted"),
    ],
)
def test_a_task_id_is_bounded_in_bytes(task_id: str, problem: str | None) -> None:
    assert task_id_problem(task_id) == problem


def test_the_coordinator_refuses_an_oversized_task_id() -> None:
    refusal = validate_reserve_request("x" * 300)
    assert refusal is not None
    assert refusal.code is ErrorCode.INVALID_ARGUMENT
    assert validate_reserve_request("x" * 256) is None


def test_the_inline_slot_lease_may_not_exceed_the_longest_lease() -> None:
    with pytest.raises(InvalidConfig, match="default_ttl_ms"):
        WorkerConfig(default_ttl_ms=70_000).validate()
    WorkerConfig(default_ttl_ms=70_000, max_slot_ttl_ms=70_000).validate()
