"""What a Writer Plugin is: the writer phase writes the calls' outputs or returns them.

A plugin is looked up by ``result_handler.type`` in a ``Writers``;
``blockx_server.pipeline.writers`` registers the ones a Worker has. Its task
context's IO scope is the only one that may write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from blockx_core.calls import RootOutput
from blockx_core.failures import FailureCode
from blockx_core.task import PluginResult
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import Plugins


class WriterPlugin(Protocol):
    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        """Write or return the outputs (in root order, each with its root index, JSON
        value and the context its Builder gave the call, so a plugin can group them
        per block); the answer is the plugin's ``result`` (JSON bytes). Raise
        PluginError on failure."""
        ...


Writers = Plugins[WriterPlugin]


def failed_writer_result(name: str, code: FailureCode, message: str) -> PluginResult:
    return PluginResult(plugin_name=name, success=False, failure_code=code, failure_message=message)
