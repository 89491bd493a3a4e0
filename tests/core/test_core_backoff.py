"""The one back-off formula: exponential ceilings, equal jitter, the draw an argument."""

from __future__ import annotations

import pytest

from blockx_core.backoff import Backoff

BACKOFF = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0)

CASES = [
    # (attempt, draw, expected delay): half the ceiling plus the draw's share of the rest
    (1, 0.0, 0.05),
    (1, 0.5, 0.075),
    (2, 0.0, 0.1),
    (3, 0.5, 0.3),
    (4, 0.0, 0.4),
    (5, 0.0, 0.5),
    (30, 0.5, 0.75),
    # An attempt below 1 counts as the first; a draw outside [0, 1] is clamped.
    (0, 0.0, 0.05),
    (1, -1.0, 0.05),
    (1, 2.0, 0.1),
]


@pytest.mark.parametrize(("attempt", "draw", "expected"), CASES)
def test_the_delay_is_half_the_ceiling_plus_a_drawn_share(
    attempt: int, draw: float, expected: float
) -> None:
    assert BACKOFF.delay(attempt, draw) == pytest.approx(expected)


@pytest.mark.parametrize("attempt", range(1, 12))
def test_every_draw_in_0_1_waits_within_half_the_ceiling_and_the_ceiling(attempt: int) -> None:
    ceiling = BACKOFF.ceiling(attempt)
    assert ceiling == min(1.0, 0.1 * 2 ** (attempt - 1))
    for draw in (0.0, 0.25, 0.5, 0.999):
        assert ceiling / 2 <= BACKOFF.delay(attempt, draw) < ceiling
