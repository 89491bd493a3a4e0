"""Plug-ins by name: one shape and one error for Call Builders and Writer Plugins.

A plug-in registers under its name (the ``type`` a task names it by) and under
any aliases the specification also spells it with. The two clusters have different
sets; ``elsewhere`` names the cluster that has a plug-in this one lacks, so the
NOT_FOUND message can say where to send the task.

A plug-in that fails raises ``PluginError``; its phase fails the task
BUILDER_FAILED or PLUGIN_FAILED, retryable as the error's failure says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, Self, TypeVar, assert_never

from blockx_core.failures import Failure, FailureCode
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome

T = TypeVar("T")


class PluginError(Exception):
    """A Call Builder or a Writer Plugin failed: ``failure`` says why and whether
    running the task again may help.

    The plug-in's own failure (a config of the wrong shape, a block not ingested
    yet) is a PLUGIN_FAILED failure with the plug-in's verdict (``of``); one caused
    by a failed IO request keeps that request's kind and its verdict (``from_io``).
    """

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure

    @classmethod
    def of(cls, message: str, *, retryable: bool) -> Self:
        return cls(Failure.of(FailureCode.PLUGIN_FAILED, message, retryable=retryable))

    @classmethod
    def from_io(cls, failed: IoFailed, what: str) -> Self:
        """The plug-in failed because ``what``, an IO request, failed: retryable
        exactly when the IO failure is."""
        return cls(Failure.of(failed.kind, f"{what} failed: {failed.kind.value}: {failed.message}"))

    @property
    def message(self) -> str:
        return self.failure.message

    @property
    def retryable(self) -> bool:
        return self.failure.retryable


def answer_of(outcome: IoOutcome, what: str) -> IoOk:
    """A plug-in's IO answer; PluginError (``from_io``) when ``what`` failed."""
    match outcome:
        case IoOk():
            return outcome
        case IoFailed():
            raise PluginError.from_io(outcome, what)
        case _:
            assert_never(outcome)


class Plugins(Generic[T]):
    """Plug-ins of one kind by name; ``get`` answers aliases too."""

    def __init__(self, kind: str, *, cluster: str = "", elsewhere: Mapping[str, str] = {}) -> None:
        self.kind = kind
        # The cluster this set belongs to ("block", "bundle"), for messages.
        self.cluster = cluster
        # Plug-in name (or alias) -> the cluster that has it.
        self.elsewhere = dict(elsewhere)
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
        here = f"the {self.cluster} worker" if self.cluster else "this worker"
        message = f"no {self.kind} {name!r} on {here} (known: {known})"
        other = self.elsewhere.get(name)
        if other is not None:
            message += f"; {name} runs on the {other} cluster: submit the task there"
        return message
