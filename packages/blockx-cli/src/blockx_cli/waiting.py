"""The "waiting for a slot: <reason>" line, on stderr, while a placement backs off.

One line each time the reason changes (not one per back-off, which would flood a
long wait), and plain lines rather than a spinner: commands such as ``drive``
hold a live display of their own on the terminal while the SDK places tasks.
"""

from __future__ import annotations

from rich.console import Console

from blockx_client import SlotWait


class WaitingLine:
    """A ``blockx_client.PlacementListener`` that shows the current reason."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._shown = ""

    def waiting(self, wait: SlotWait) -> None:
        text = f"waiting for a slot: {wait.reason}"
        if text != self._shown:
            style = "dim" if self._console.is_terminal else None
            self._console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
            self._shown = text

    def done(self) -> None:
        self._shown = ""
