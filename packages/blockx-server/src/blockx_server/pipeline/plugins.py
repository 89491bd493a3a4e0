"""Plug-ins by name: one shape for Call Builders and Writer Plugins.

A plug-in registers under its name (the ``type`` a task names it by) and under
any aliases the specification also spells it with.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Plugins(Generic[T]):
    """Plug-ins of one kind by name; ``get`` answers aliases too."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, entry: T, *, aliases: Iterable[str] = ()) -> None:
        aliases = tuple(aliases)
        for key in (name, *aliases):
            if key in self._entries or key in self._aliases:
                raise ValueError(f"{self.kind} {key!r} is registered twice")
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name

    def get(self, name: str) -> T | None:
        return self._entries.get(self._aliases.get(name, name))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def missing(self, name: str) -> str:
        """What to tell a user who named a plug-in this worker does not have."""
        known = ", ".join(self.names()) or "none"
        return f"no {self.kind} {name!r} on this worker (known: {known})"
