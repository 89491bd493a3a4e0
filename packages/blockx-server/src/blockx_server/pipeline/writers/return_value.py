"""``ReturnValueResultHandler``: the outputs come back to the client, nothing is written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blockx_core.calls import RootOutput
from blockx_server.pipeline.context import TaskContext


class ReturnValueResultHandler:
    """``pluginResults[0].result`` = the JSON array of the call outputs."""

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        return b"[" + b",".join([output.value_json for output in outputs]) + b"]"
