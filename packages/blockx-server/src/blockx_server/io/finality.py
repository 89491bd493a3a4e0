"""What the IO subsystem knows of the chain: its epoch and finalized height.

The owner of the block database refreshes a ``FinalityView`` (at most every
IO_FINALITY_REFRESH_MS); the router reads it on every request. A backend decides
from ``finalized`` whether an answer can never change (``IoBackend.immutable``),
and the read cache keys every answer by ``epoch``, so a new epoch (a reorganisation
below the finalized height) drops every answer read before it.
"""

from __future__ import annotations

from typing import Protocol


class FinalityView(Protocol):
    @property
    def epoch(self) -> int: ...

    @property
    def finalized(self) -> int | None:
        """The highest finalized block number, None while unknown."""
        ...


class StaticFinality:
    """A view set by hand (tests, and processes without a block database)."""

    def __init__(self, finalized: int | None = None, epoch: int = 0) -> None:
        self.finalized = finalized
        self.epoch = epoch
