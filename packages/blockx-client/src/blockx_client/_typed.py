"""A decoded JSON value as the type a caller asks for (``msgspec.convert``).

Function values and plugin results travel as JSON, so they decode to ``Any``.
Asking for a type checks the value against it (and builds Structs, dataclasses,
TypedDicts and the like from JSON objects) instead of trusting a ``cast``; the
conversion is strict: a string never passes for a number, nor a list for a set.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from blockx_client.errors import ResultTypeError

T = TypeVar("T")


def as_type(value: object, result_type: type[T], *, what: str) -> T:
    """``value`` converted to ``result_type``; ResultTypeError names ``what`` when
    it does not fit."""
    try:
        return msgspec.convert(value, type=result_type)
    except msgspec.ValidationError as exc:
        name = result_type.__name__ if isinstance(result_type, type) else repr(result_type)
        raise ResultTypeError(f"{what} is not a {name}: {exc}", value) from None
