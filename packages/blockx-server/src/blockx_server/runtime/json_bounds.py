"""JSON from clients, decoded with a bound on how deeply it nests (measured as a
function's result is: ``blockx_executor.results.nests_deeper``).

msgspec decodes nesting up to the interpreter's recursion limit and then raises
RecursionError, which is not a DecodeError: deep JSON in a task's config or in
an Invoke's args would escape the handlers' "not valid JSON" answer. Nesting
beyond ``MAX_JSON_DEPTH`` arrays and objects is refused as a DecodeError, with
a message that says so; no call builder or function needs more.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx_executor.results import nests_deeper

MAX_JSON_DEPTH: Final = 64


class JsonTooDeep(msgspec.DecodeError):
    """The JSON nests arrays and objects deeper than allowed."""


def _too_deep(limit: int) -> JsonTooDeep:
    return JsonTooDeep(f"arrays and objects nested deeper than {limit} levels")


def decode_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``msgspec.json.decode(text)``; JsonTooDeep when it nests deeper than ``max_depth``."""
    try:
        value = msgspec.json.decode(text)
    except RecursionError:
        raise _too_deep(max_depth) from None
    if nests_deeper(value, text, max_depth):
        raise _too_deep(max_depth)
    return value


# Up to this size a document is decoded to measure its depth exactly; a larger one
# is only scanned, and nesting is then bounded by what the decoder can hold.
EXACT_DEPTH_BYTES: Final = 1 << 20


def check_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise a DecodeError unless ``text`` is JSON; JsonTooDeep when it nests deeper
    than ``max_depth`` (exactly up to ``EXACT_DEPTH_BYTES``; beyond, deeper than the
    decoder can hold). No values are built for a large document."""
    if len(text) <= EXACT_DEPTH_BYTES:
        decode_json(text, max_depth=max_depth)
        return
    try:
        msgspec.json.decode(text, type=msgspec.Raw)
    except RecursionError:
        raise _too_deep(max_depth) from None
