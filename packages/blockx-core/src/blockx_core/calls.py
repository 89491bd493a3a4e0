"""What a call is made of, from a Call Builder to a Writer Plugin.

A Builder produces ``RootCall`` values: the positional and keyword arguments of
one call of the task's function, and an optional ``CallContext`` with the chain
facts the call is about (its block). The context travels with the call to the
executor (``current_call()`` shows it; sub-calls inherit it) and comes back on
the call's output: the Calls phase converges with one ``RootOutput`` per root
call, in root order, so a Writer Plugin can group outputs per block or bundle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec


class CallContext(msgspec.Struct, frozen=True, kw_only=True):
    """Chain facts a Builder attaches to a call; ``None`` where it set nothing."""

    block_number: int | None = None
    block_hash: str | None = None


class RootCall(msgspec.Struct, frozen=True):
    """One root call of a task: ``function(*args, **kwargs)`` about ``context``."""

    args: list[Any]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    context: CallContext | None = None


class RootOutput(msgspec.Struct, frozen=True, gc=False):
    """The result of root call ``index`` (0-based, in the order the roots came) as
    JSON text, with the context its Builder gave the call. (Untracked by the
    garbage collector: it holds only bytes and a context, and tasks make many.)"""

    index: int
    value_json: bytes
    context: CallContext | None = None


class RootOutputs(Sequence[RootOutput]):
    """A task's outputs in root order, each ``RootOutput`` made when it is read.

    The Calls phase keeps one JSON value (and one context, when the Builder gave
    any) per root call; tagging them as they are read, rather than all at once
    when the phase ends, keeps a task of a million calls from holding a million
    more objects while its Writer Plugin runs. Compares equal to the list of the
    same outputs.
    """

    __slots__ = ("_contexts", "_first", "_values")

    def __init__(
        self,
        values: Sequence[bytes],
        contexts: Sequence[CallContext | None] | None = None,
        *,
        first: int = 0,
    ) -> None:
        if contexts is not None and len(contexts) != len(values):
            raise ValueError("one context per output, or none at all")
        self._values = values
        self._contexts = contexts
        # The root index of the first output (outputs taken before are not here).
        self._first = first

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> RootOutput: ...

    @overload
    def __getitem__(self, index: slice) -> list[RootOutput]: ...

    def __getitem__(self, index: int | slice) -> RootOutput | list[RootOutput]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self._values)
        if not -n <= index < n:
            raise IndexError("output index out of range")
        index %= n
        context = None if self._contexts is None else self._contexts[index]
        return RootOutput(self._first + index, self._values[index], context)

    def __iter__(self) -> Iterator[RootOutput]:
        indexes = range(self._first, self._first + len(self._values))
        if self._contexts is None:
            return map(RootOutput, indexes, self._values)
        return map(RootOutput, indexes, self._values, self._contexts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RootOutputs | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RootOutputs({list(self)!r})"
