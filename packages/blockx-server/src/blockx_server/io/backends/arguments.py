"""Binding an IO request's positional and keyword arguments to an operation's parameters."""

from __future__ import annotations

from typing import Any


def bind_arguments(
    args: list[Any],
    kwargs: dict[str, Any],
    signature: str,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> list[Any]:
    """Positional and keyword arguments as one list in parameter order (None for an
    optional parameter not given); TypeError naming ``signature`` otherwise."""
    names = required + optional
    if len(args) > len(names) or any(name not in names for name in kwargs):
        raise TypeError(signature)
    bound: dict[str, Any] = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name in bound:
            raise TypeError(signature)
        bound[name] = value
    if any(name not in bound for name in required):
        raise TypeError(signature)
    return [bound.get(name) for name in names]
