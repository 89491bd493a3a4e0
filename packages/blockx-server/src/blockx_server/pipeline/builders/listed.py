"""Builders whose calls are listed in their config: CallListCallConfig, InputsCallConfig.

For them parsing the config is building its calls, CPU only and as long as the
list: ``build_listed`` takes the config's JSON text and is run by the Worker on a
thread, never on its event loop (``blockx_server.worker.offload``).

It is bounded by TASK_MAX_CALLS before anything is built: ``count_listed`` counts
the elements of the list in one pass that keeps a pointer per element and no
element, and stops at the first past the limit. A config of ten million calls is
refused after reading a million, holding none of them. Only a list within the
limit is decoded into calls, each element turned into its ``RootCall`` as it is
read (``decode_listed``), so there is never a second copy of the list.

Both passes call back into Python once per element, which lets the event loop's
thread take the interpreter between elements: a long parse never holds it for
more than a switch interval.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

import msgspec

from blockx_server.pipeline.builders.base import CallBuilder, CallList
from blockx_server.pipeline.plugins import PluginError


class Element:
    """Stands for each element of a listed config while it is counted or built: the
    decode hook returns the one shared instance, so the list holds only pointers."""


_ELEMENT: Final = Element()

# TASK_MAX_CALLS: root calls one task may make, whatever its Builder.
DEFAULT_TASK_MAX_CALLS: Final = 1_000_000

# The JSON names msgspec's own messages use.
_JSON_KINDS: Final[dict[type, str]] = {
    dict: "object",
    list: "array",
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    type(None): "null",
}


def json_kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


@runtime_checkable
class ListedCallBuilder(CallBuilder, Protocol):
    """A Call Builder whose calls are listed in its config. ``build_listed`` is CPU
    only (no IO, no event loop): the Worker runs it on a thread."""

    def build_listed(self, config: str, max_calls: int) -> CallList: ...


class _Stop(Exception):
    """Raised from the count hook to stop reading past the limit."""


@functools.cache
def _counting(field: str) -> type[msgspec.Struct]:
    # Only ``field`` is read; every other member is skipped without being decoded.
    return msgspec.defstruct(
        "ListedCount", [(field, list[Element], msgspec.field(default_factory=list))]
    )


def count_listed(config: str, field: str, at_most: int) -> int:
    """The number of elements of the array ``field`` of the JSON object ``config``,
    counting no further than ``at_most + 1``. A config of another shape counts what
    was read before the shape broke (the Builder's decode then says what is wrong)."""
    count = 0

    def hook(kind: type, value: Any) -> Any:
        nonlocal count
        if kind is not Element:
            raise NotImplementedError(kind)
        count += 1
        if count > at_most:
            raise _Stop
        return _ELEMENT

    with contextlib.suppress(_Stop, msgspec.MsgspecError):
        msgspec.json.decode(config, type=_counting(field), dec_hook=hook)
    return count


def too_many_calls(builder: str, max_calls: int) -> PluginError:
    return PluginError.of(
        f"{builder}: more than TASK_MAX_CALLS ({max_calls}) calls in one task; split the task",
        retryable=False,
    )


def check_call_count(builder: str, count: int, max_calls: int) -> None:
    """PluginError (not retryable) when ``count`` calls exceed TASK_MAX_CALLS."""
    if count > max_calls:
        raise too_many_calls(builder, max_calls)


Decl = TypeVar("Decl", bound=msgspec.Struct)


def decode_listed(
    builder: str, config: str, kind: type[Decl], shape: str, element: Callable[[Any], None]
) -> Decl:
    """``config`` decoded as ``kind``, whose list is of ``Element``: ``element`` is
    called with each element of the list in order (raising PluginError, or
    TypeError for a message about its shape). A config that does not fit is a
    PluginError (not retryable) naming ``builder`` and the expected ``shape``."""

    def hook(target: type, value: Any) -> Any:
        if target is not Element:
            raise NotImplementedError(target)
        element(value)
        return _ELEMENT

    try:
        decl = msgspec.json.decode(config or "{}", type=kind, dec_hook=hook)
    except msgspec.ValidationError as exc:
        raise PluginError.of(f"{builder}: {exc}; expected {shape}", retryable=False) from None
    except msgspec.DecodeError as exc:
        raise PluginError.of(f"{builder}: the config is not JSON: {exc}", retryable=False) from None
    if not getattr(decl, "function", ""):
        raise PluginError.of(f"{builder}: `function` must not be empty", retryable=False)
    return decl
