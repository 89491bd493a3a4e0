"""What a function may return: strict JSON data, checked before its result leaves.

msgspec (the executor's encoder) writes much more than JSON's data types, and does
it silently: a set becomes an array, bytes a base64 string, a datetime an ISO
string, NaN and Infinity ``null``, and an int dict key a string key. A reader of
the result would get something else than the function returned, so such a value
fails the call with ``BAD_RESULT`` and a message naming where it is and what to
return instead.

Accepted: ``dict`` with ``str`` keys, ``list``, ``tuple`` (written as an array, as
``json.dumps`` does), ``str``, ``int``, finite ``float``, ``bool`` and ``None``,
and subclasses of these (an ``enum.StrEnum`` member is a ``str``), nested at most
``MAX_DEPTH`` containers deep: the encoder takes nearly a thousand levels, and a
reader decoding the text deeper in its own stack (a client, a writer) would fail
on it with a RecursionError.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import msgspec

# The types a result is made of; checked by identity first, the cheap common case.
# Types whose msgspec JSON text is always strict JSON (a float may be NaN).
JSON_SCALARS: Final = frozenset({str, int, bool, type(None)})
_CONTAINERS: Final = frozenset({dict, list, tuple})

MAX_DEPTH: Final = 512

# What to return instead, by the name of the type that was returned.
_HINTS: Final = {
    "set": "return a list, e.g. sorted(...)",
    "frozenset": "return a list, e.g. sorted(...)",
    "bytes": "return text, e.g. .hex() or .decode()",
    "bytearray": "return text, e.g. .hex() or .decode()",
    "memoryview": "return text, e.g. .hex()",
    "datetime": "return text or a number, e.g. .isoformat() or .timestamp()",
    "date": "return text, e.g. .isoformat()",
    "time": "return text, e.g. .isoformat()",
    "timedelta": "return a number, e.g. .total_seconds()",
    "Decimal": "return a str or a float",
    "UUID": "return str(...)",
}


def json_problem(value: Any, encoded: bytes) -> str | None:
    """None when ``value`` (whose JSON text is ``encoded``) is strict JSON data, else
    ``result[...]: <what> is not JSON (<what to do>)`` for the first offending place
    found.

    The common case costs one decode and one comparison, both in C: what msgspec
    changed on the way out (a set into a list, NaN into null, an int key into a
    string) no longer compares equal. Only a value that differs is walked, to find
    the place, or to accept it when the difference was only tuples becoming lists.
    Call it after the value has encoded: the encoder has then refused cycles and
    over-deep nesting, so the walk ends."""
    if type(value) in JSON_SCALARS:
        return None
    # Every container opens with a bracket: fewer brackets than the bound, no
    # container can be nested that deep, and counting them is one pass in C.
    if nests_deeper(value, encoded, MAX_DEPTH):
        return f"result: nested more than {MAX_DEPTH} containers deep (return a flatter value)"
    if _decode(encoded) == value:
        return None
    if isinstance(value, dict | list | tuple):
        return _walk(value)
    problem = _scalar_problem(value)
    return None if problem is None else f"result: {problem}"


def _walk(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str | None:
    # Each container is first judged by the set of its element types, in C; only a
    # container holding other containers, or something suspect, is looked at one
    # element at a time. Paths are built only for the answer: each container on the
    # stack carries a link to its parent's path.
    stack: list[tuple[Any, _Path]] = [(value, None)]
    while stack:
        container, path = stack.pop()
        if isinstance(container, dict):
            if not set(map(type, container)) <= _STR:
                for key in container:
                    if not isinstance(key, str):
                        return (
                            f"{_render(path)}: key {key!r} is {type(key).__name__}, not str "
                            "(JSON object keys are strings; use str(key))"
                        )
            kinds = set(map(type, container.values()))
            items: Any = container.items()
        else:
            kinds = set(map(type, container))
            items = enumerate(container)
        if kinds <= JSON_SCALARS or (kinds <= _NUMBERS and _all_finite(container)):
            continue
        for key, child in items:
            kind = type(child)
            if kind in JSON_SCALARS:
                continue
            if kind in _CONTAINERS or isinstance(child, dict | list | tuple):
                stack.append((child, (key, path)))
                continue
            problem = _scalar_problem(child)
            if problem is not None:
                return f"{_render((key, path))}: {problem}"
    return None


def nests_deeper(value: Any, text: str | bytes, limit: int) -> bool:
    """Whether ``value``, whose JSON text is ``text``, nests more than ``limit`` arrays
    and objects deep. Every level opens with a bracket: a text with no more brackets
    than ``limit`` cannot, and counting them is one pass in C; only a text with more
    has its value walked."""
    if isinstance(text, str):
        opening = text.count("[") + text.count("{")
    else:
        opening = text.count(b"[") + text.count(b"{")
    return opening > limit and json_depth(value, stop_past=limit) > limit


def json_depth(value: Any, *, stop_past: int | None = None) -> int:
    """How many arrays and objects (a tuple is an array) ``value`` nests (0 for a
    scalar), without recursion; with ``stop_past``, counting stops at the first level
    past it."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if stop_past is not None and deepest > stop_past:
            return deepest
        stack.extend(
            (child, depth + 1) for child in children if isinstance(child, dict | list | tuple)
        )
    return deepest


_decode: Final = msgspec.json.Decoder().decode
_STR: Final = frozenset({str})
_NUMBERS: Final = frozenset({int, float, bool})


def _all_finite(container: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> bool:
    numbers = container.values() if isinstance(container, dict) else container
    try:
        return all(map(math.isfinite, numbers))
    except OverflowError:  # an int too large for a float: look at each element
        return False


# A path as a linked list from the innermost key out: (key, parent) or None (the root).
_Path = tuple[Any, "_Path"] | None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"{value!r} is not JSON (JSON has no NaN or Infinity; return None or a str)"
    if isinstance(value, str | int):  # subclasses: StrEnum, IntEnum, ...
        return None
    name = type(value).__name__
    hint = _HINTS.get(name, "return dict, list, str, int, float, bool or None")
    return f"{name} is not JSON ({hint})"


def _render(path: _Path) -> str:
    keys: list[str] = []
    while path is not None:
        key, path = path
        keys.append(f"[{json.dumps(key)}]" if isinstance(key, str) else f"[{key}]")
    return "result" + "".join(reversed(keys))
