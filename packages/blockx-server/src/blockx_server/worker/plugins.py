"""Writer Plugins: the Plugin phase writes the calls' outputs or returns them.

Looked up by ``result_handler.type``; adding a plugin is adding a registry entry.
"""

from __future__ import annotations

from typing import Any, Protocol

from blockx_core.errors import FailureCode
from blockx_core.task import PluginResult
from blockx_server.worker.context import TaskContext


class PluginError(Exception):
    """A plugin failed. Unclassified failures are retryable (the seeds' default)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class WriterPlugin(Protocol):
    async def execute(self, ctx: TaskContext, config: Any, outputs: list[bytes]) -> bytes:
        """Write or return the outputs (JSON texts, in root order); the answer is the
        plugin's ``result`` (JSON bytes). Raise PluginError on failure."""
        ...


class ReturnValueResultHandler:
    """``pluginResults[0].result`` = the JSON array of the call outputs."""

    async def execute(self, ctx: TaskContext, config: Any, outputs: list[bytes]) -> bytes:
        return b"[" + b",".join(outputs) + b"]"


class PluginRegistry:
    def __init__(
        self, plugins: dict[str, WriterPlugin], aliases: dict[str, str] | None = None
    ) -> None:
        self._plugins = dict(plugins)
        self._aliases = dict(aliases or {})

    def get(self, type_name: str) -> WriterPlugin | None:
        return self._plugins.get(self._aliases.get(type_name, type_name))

    def names(self) -> list[str]:
        return sorted(self._plugins)


def default_plugins() -> PluginRegistry:
    """The plugins of this step; seed 003 spells the return-value handler
    ``ReturnValueHandler``, accepted as an alias."""
    return PluginRegistry(
        {"ReturnValueResultHandler": ReturnValueResultHandler()},
        aliases={"ReturnValueHandler": "ReturnValueResultHandler"},
    )


def failed_plugin_result(name: str, code: FailureCode, message: str) -> PluginResult:
    return PluginResult(plugin_name=name, success=False, failure_code=code, failure_message=message)
