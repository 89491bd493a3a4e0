"""The "waiting for a slot: <reason>" line, on stderr, while a placement backs off.

On a terminal it is a spinner updated in place; otherwise (a pipe, a log) it is
one line each time the reason changes, so scripts see it without a flood.
"""

from __future__ import annotations

from rich.console import Console
from rich.status import Status

from blockx_client import SlotWait


class WaitingLine:
    """A ``blockx_client.PlacementListener`` that shows the current reason."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._status: Status | None = None
        self._shown = ""

    def waiting(self, wait: SlotWait) -> None:
        text = f"waiting for a slot: {wait.reason}"
        if self._console.is_terminal:
            if self._status is None:
                self._status = self._console.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif text != self._shown:
            self._console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._shown = text

    def done(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        self._shown = ""
