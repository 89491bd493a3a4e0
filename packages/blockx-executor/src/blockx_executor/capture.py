"""What functions print: ``sys.stdout`` and ``sys.stderr`` of the executor are
``CallStream``\\ s that keep the text of the call running now, per call and bounded
(``CallOutputs``); the runner sends it to the Worker as ``CallOutput`` with the
call's suspension or outcome, and the Worker logs each line tagged with the call.

Text written while no call runs (a module's top level, the executor's own
messages), and bytes written to file descriptors 1 and 2 directly, go to the
executor's real stdout and stderr: a pipe the Worker reads.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import Any, Final, TextIO

from blockx_executor.protocol import CallOutput

# A debug call's output goes back to whoever asked (DebugInvoke): kept up to this
# much even when the bound for the Worker's log is smaller.
DEBUG_OUTPUT_BYTES: Final = 1 << 20


class CallOutputs:
    """The text each call printed and not yet sent, at most ``limit`` bytes per call
    over all its runs (a debug call: at least ``DEBUG_OUTPUT_BYTES``); the rest is
    counted. ``current`` is the call running now (0: none), set by the runner."""

    __slots__ = ("_debug", "_dropped", "_limit", "_sizes", "_texts", "current")

    def __init__(self, limit: int) -> None:
        self.current = 0
        self._limit = limit
        self._texts: dict[int, list[str]] = {}
        self._sizes: dict[int, int] = {}  # bytes kept so far, per call
        self._dropped: dict[int, int] = {}
        self._debug: set[int] = set()

    @property
    def pending(self) -> bool:
        """Some call has printed and not ended yet."""
        return bool(self._sizes)

    def debug(self, call_id: int) -> None:
        self._debug.add(call_id)

    def add(self, call_id: int, text: str) -> None:
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        used = self._sizes.get(call_id, 0)
        limit = max(self._limit, DEBUG_OUTPUT_BYTES) if call_id in self._debug else self._limit
        room = limit - used
        if size > room:
            self._dropped[call_id] = self._dropped.get(call_id, 0) + size - max(room, 0)
            text = text[: max(room, 0)]
            size = max(room, 0)
        self._sizes[call_id] = used + size
        if text:
            self._texts.setdefault(call_id, []).append(text)

    def take(self, call_id: int, *, ended: bool) -> CallOutput | None:
        """What ``call_id`` printed since the last take; when it ``ended``, with the
        bytes it went over by, and the call is forgotten."""
        texts = self._texts.pop(call_id, None)
        dropped = 0
        if ended:
            self._sizes.pop(call_id, None)
            self._debug.discard(call_id)
            dropped = self._dropped.pop(call_id, 0)
        if texts is None and not dropped:
            return None
        return CallOutput(call_id, "".join(texts or ()), dropped)

    def forget(self, call_id: int) -> None:
        for kept in (self._texts, self._sizes, self._dropped):
            kept.pop(call_id, None)
        self._debug.discard(call_id)


class CallStream(io.TextIOBase):
    """``sys.stdout`` / ``sys.stderr`` of the executor: the running call's text goes
    to ``outputs``, anything else to ``real`` (the pipe to the Worker)."""

    encoding = "utf-8"

    def __init__(self, outputs: CallOutputs, real: TextIO) -> None:
        super().__init__()
        self._outputs = outputs
        self._real = real

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        outputs = self._outputs
        if outputs.current:
            outputs.add(outputs.current, text)
            return len(text)
        return self._real.write(text)

    def flush(self) -> None:
        self._real.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._real.fileno()

    @property
    def buffer(self) -> Any:  # bytes written here go to the pipe as they are
        return self._real.buffer


def install(outputs: CallOutputs) -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` this process's ``CallStream``\\ s."""
    sys.stdout = CallStream(outputs, sys.__stdout__ or sys.stdout)
    sys.stderr = CallStream(outputs, sys.__stderr__ or sys.stderr)


@contextlib.contextmanager
def debug_logging() -> Iterator[None]:
    """One run of a debug call: logging at every level goes to its output."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
