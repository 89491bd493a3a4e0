"""How numbers read on the pages (Jinja filters); the JSON twins keep the raw values.

Every filter reads any 64-bit integer and any float, NaN and infinities included:
a value some source got wrong reads oddly, and the page is still served."""

from __future__ import annotations

import datetime
import math
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

# What a value that is not known reads as.
NONE: Final = "\N{EN DASH}"


def age(ms: int | None) -> str:
    """``850 ms``, ``3.2 s``, ``4.1 min``, ``2.5 h``, ``3.0 d``."""
    if ms is None:
        return NONE
    ms = max(0, ms)
    if ms < 1_000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7_200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def seconds(value: float | None) -> str:
    if value is None:
        return NONE
    ms = value * 1000
    return age(int(ms)) if math.isfinite(ms) else NONE


def percent(fraction: float | None) -> str:
    """A 0..1 fraction as a percentage for display: ``0.682`` reads ``68.2 %``."""
    return NONE if fraction is None else f"{fraction * 100:.1f} %"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def timestamp(ms: int | None) -> str:
    """Unix ms as UTC, to the millisecond: ``2026-12-01 20:46:04.120Z``."""
    if not ms:
        return NONE
    try:
        at = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ms:,} ms (not a date)"
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def number(n: int | float | None) -> str:
    if n is None:
        return NONE
    return f"{n:,.1f}" if isinstance(n, float) else f"{n:,}"


# Ids longer than this are shown cut in the middle (the title attribute has them whole).
SHORTEN_AT: Final = 40


def shorten(text: str) -> str:
    """A long id as its head and tail: ``backfill-7f3a…c9d2e1``."""
    if len(text) <= SHORTEN_AT:
        return text
    return text[: SHORTEN_AT - 12] + "\N{HORIZONTAL ELLIPSIS}" + text[-11:]


def quote(text: str) -> str:
    """For a query string value: every reserved character escaped."""
    return urllib.parse.quote(text, safe="")


FILTERS: Final[dict[str, Callable[..., Any]]] = {
    "age": age,
    "seconds": seconds,
    "percent": percent,
    "size": size,
    "timestamp": timestamp,
    "number": number,
    "quote": quote,
    "shorten": shorten,
}
