"""What a debug call prints or logs, routed into a buffer of its own."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def capturing(buffer: io.StringIO | None) -> Iterator[None]:
    """Route print() and logging into ``buffer`` for one segment of a call (nothing
    when ``buffer`` is None)."""
    if buffer is None:
        yield
        return
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
