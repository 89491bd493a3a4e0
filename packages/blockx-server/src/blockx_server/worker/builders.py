"""Call Builders: the Builder phase expands ``function_call_config`` into calls.

A Builder is looked up by ``function_call_config.type``. Adding one (the block-table,
bundle and streaming builders of a later step, or a cluster's own set) is a matter
of adding an entry to a ``BuilderRegistry``.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from blockx_server.worker.context import TaskContext


class CallList(msgspec.Struct, frozen=True):
    """Root calls: ``function`` once per argument list."""

    function: str
    calls: list[list[Any]]


class BuilderError(Exception):
    """The Builder could not expand the config. A config of the wrong shape is not
    retryable; a failed IO read may be."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class CallBuilder(Protocol):
    async def build(self, ctx: TaskContext, config: Any) -> CallList: ...


class _CallListConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    call_list: list[list[Any]]


class CallListCallConfig:
    """``{"function": "name", "callList": [[args...], ...]}``: one root call per list."""

    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        try:
            decl = msgspec.convert(config, _CallListConfig)
        except msgspec.ValidationError as exc:
            raise BuilderError(
                f"CallListCallConfig: {exc}; expected "
                '{"function": "<name>", "callList": [[<args>], ...]}'
            ) from None
        if not decl.function:
            raise BuilderError("CallListCallConfig: `function` must not be empty")
        return CallList(decl.function, decl.call_list)


class BuilderRegistry:
    """Builders by type name; aliases map the seeds' other spellings to a name."""

    def __init__(
        self, builders: dict[str, CallBuilder], aliases: dict[str, str] | None = None
    ) -> None:
        self._builders = dict(builders)
        self._aliases = dict(aliases or {})

    def get(self, type_name: str) -> CallBuilder | None:
        return self._builders.get(self._aliases.get(type_name, type_name))

    def names(self) -> list[str]:
        return sorted(self._builders)


def default_builders() -> BuilderRegistry:
    """The builders both clusters have in this step."""
    return BuilderRegistry({"CallListCallConfig": CallListCallConfig()})
