"""The failure vocabulary: every kind has a verdict, and spellings shared by two
enums never disagree."""

from __future__ import annotations

import enum

import pytest

from blockx_core.failures import (
    RETRYABLE,
    CallFailureKind,
    ClientFailureCode,
    Failure,
    FailureCode,
    FailureKind,
    IoErrorKind,
    PrecheckFailure,
    call_failure_kind,
    is_retryable,
)
from blockx_executor.protocol import FailureKind as ExecutorFailureKind

KINDS: list[type[enum.StrEnum]] = [
    FailureCode,
    ClientFailureCode,
    CallFailureKind,
    IoErrorKind,
    PrecheckFailure,
]
EVERY_KIND: list[FailureKind] = [
    *FailureCode,
    *ClientFailureCode,
    *CallFailureKind,
    *IoErrorKind,
    *PrecheckFailure,
]


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: k.__name__)
def test_every_kind_says_whether_it_is_retryable(kinds: type[enum.StrEnum]) -> None:
    assert all(kind in RETRYABLE for kind in kinds)


def test_kinds_spelled_alike_share_one_verdict() -> None:
    # The enums are strs: one spelling is one key, so each spelling must have been
    # given the same verdict wherever it was written down.
    verdicts: dict[str, set[bool | None]] = {}
    for kind in EVERY_KIND:
        verdicts.setdefault(kind.value, set()).add(RETRYABLE[kind])
    assert {value: v for value, v in verdicts.items() if len(v) > 1} == {}


def test_the_failure_decides_only_where_the_table_leaves_it() -> None:
    undecided = {kind for kind, verdict in RETRYABLE.items() if verdict is None}
    assert undecided == {
        FailureCode.BUILDER_FAILED,
        FailureCode.PLUGIN_FAILED,
        ClientFailureCode.PLACEMENT_FAILED,
    }
    assert set(CallFailureKind) <= {k for k, v in RETRYABLE.items() if v is not None}


def test_client_codes_never_collide_with_the_workers() -> None:
    assert not {c.value for c in ClientFailureCode} & {c.value for c in FailureCode}


CASES = [
    # (kind, retryable given, expected)
    (CallFailureKind.EXECUTOR_LOST, None, True),
    (CallFailureKind.EXECUTOR_LOST, False, False),  # narrowed: the cause cannot change
    (CallFailureKind.USER_ERROR, True, False),  # never widened
    (IoErrorKind.UNAVAILABLE, None, True),
    (IoErrorKind.BAD_REQUEST, True, False),
    (FailureCode.PLUGIN_FAILED, True, True),  # the failure decides
    (FailureCode.PLUGIN_FAILED, None, False),
    (ClientFailureCode.PLACEMENT_FAILED, True, True),
]


@pytest.mark.parametrize(("kind", "given", "expected"), CASES)
def test_failure_of_takes_the_tables_verdict(
    kind: CallFailureKind | IoErrorKind | FailureCode | ClientFailureCode,
    given: bool | None,
    expected: bool,
) -> None:
    assert Failure.of(kind, "m", retryable=given) == Failure(kind, "m", expected)


def test_is_retryable_falls_back_only_where_the_failure_decides() -> None:
    assert is_retryable(FailureCode.BUILDER_FAILED, otherwise=True) is True
    assert is_retryable(FailureCode.BUILDER_FAILED) is False
    assert is_retryable(FailureCode.CALL_FAILED, otherwise=True) is False


def test_every_executor_kind_decodes_to_its_call_kind() -> None:
    for wire in ExecutorFailureKind:
        assert call_failure_kind(wire.value).value == wire.value
    assert call_failure_kind("SOMETHING_NEW") is CallFailureKind.USER_ERROR
