"""The dispatcher's call states: the transition table on every (state, move) pair."""

from __future__ import annotations

import pytest

from blockx_core.calls import RootCall
from blockx_core.dispatch._state import (
    CALL_MOVES,
    Call,
    CallMove,
    CallState,
    InvalidCallMove,
    TaskCalls,
)

WAITING, PLACED, BACKING_OFF = CallState.WAITING, CallState.PLACED, CallState.BACKING_OFF

ALLOWED = [
    # (state, move, next state)
    (WAITING, CallMove.PLACE, PLACED),
    (PLACED, CallMove.LEAVE, WAITING),
    (WAITING, CallMove.BACK_OFF, BACKING_OFF),
    (BACKING_OFF, CallMove.RETRY, WAITING),
]
ILLEGAL = [
    (state, move)
    for state in CallState
    for move in CallMove
    if not any(state is s and move is m for s, m, _ in ALLOWED)
]


def call_in(state: CallState, executor_id: str | None) -> Call:
    task = TaskCalls("t", "code", "f", 1, 1_000)
    task.add([RootCall([1])])
    call = Call(1, task, 0, 0, "code", "f", [1], None, None)
    call.state = state
    call.executor_id = executor_id
    return call


def test_transition_table_is_exactly_the_allowed_rows() -> None:
    assert dict(CALL_MOVES) == {(s, m): n for s, m, n in ALLOWED}
    assert len(ILLEGAL) == len(CallState) * len(CallMove) - len(ALLOWED) == 8


@pytest.mark.parametrize(("state", "move", "expected"), ALLOWED)
def test_allowed_call_move(state: CallState, move: CallMove, expected: CallState) -> None:
    call = call_in(state, "e1" if state is PLACED else None)
    call.move(move, executor_id="e2" if move is CallMove.PLACE else None)
    assert call.state is expected
    # A call is on an executor exactly while it is PLACED.
    assert call.executor_id == ("e2" if expected is PLACED else None)


@pytest.mark.parametrize(("state", "move"), ILLEGAL)
def test_illegal_call_move_raises_and_keeps_state(state: CallState, move: CallMove) -> None:
    executor_id = "e1" if state is PLACED else None
    call = call_in(state, executor_id)
    with pytest.raises(InvalidCallMove, match=move.name):
        call.move(move, executor_id="e2")
    assert call.state is state
    assert call.executor_id == executor_id


def test_the_table_answers_as_a_search_by_equality_would() -> None:
    """States and moves hash by identity (cheaper than Enum's hash of the name): a
    member got back by value or by name is the same key, and the lookup agrees
    with a linear search of the table by ``==``."""
    for state in CallState:
        for move in CallMove:
            searched = [t for (s, m), t in CALL_MOVES.items() if s == state and m == move]
            by_value = CALL_MOVES.get((CallState(state.value), CallMove[move.name]))
            assert by_value == (searched[0] if searched else None)
            assert hash(CallState(state.value)) == hash(state)
