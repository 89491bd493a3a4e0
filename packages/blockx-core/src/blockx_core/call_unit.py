"""What one call of a chain scan gets: a row, a block with its rows, or a decoded event.

A chain Builder (BlockTableCallConfig, BlockBundleCallConfig) reads it as the
``unit`` key of its config, and the drivers and the CLI set it there. ``event``
comes with a registered ABI and an event's name (``"abi"``, ``"event"``) and reads
the ``EVENT_TABLE``.
"""

from __future__ import annotations

import enum
from typing import Final

# The table an ``event`` unit reads.
EVENT_TABLE: Final = "logs"


class CallUnit(enum.StrEnum):
    # One call per matching row, with the row.
    ROW = "row"
    # One call per block, with ``{"block": <block row>, "rows": [...]}``.
    BLOCK = "block"
    # One call per log that decodes as the named event, with ``{"block", "log", "event"}``.
    EVENT = "event"
