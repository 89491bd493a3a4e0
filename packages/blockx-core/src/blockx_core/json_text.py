"""JSON text a user gives (a task file, ``--call``, ``--where``, an argument), decoded.

``json.loads`` raises RecursionError, not ValueError, for text nested deeper than
the interpreter's recursion limit allows: ``parse_json`` makes it the ValueError
every other malformed text is, so one ``except ValueError`` covers both.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None
