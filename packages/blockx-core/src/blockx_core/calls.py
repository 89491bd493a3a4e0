"""What a call is made of, from a Call Builder to a Writer Plugin.

A Builder produces ``RootCall`` values: the positional and keyword arguments of
one call of the task's function, and an optional ``CallContext`` with the chain
facts the call is about (its block). The context travels with the call to the
executor (``current_call()`` shows it; sub-calls inherit it) and comes back on
the call's output: the Calls phase converges with one ``RootOutput`` per root
call, in root order, so a Writer Plugin can group outputs per block or bundle.
"""

from __future__ import annotations

from typing import Any

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
