"""The Builder phase's work: the task's calls from its config, bounded and off the loop.

A listed Builder (CallListCallConfig, InputsCallConfig) counts and builds on a
thread from the config's text (``pipeline/builders/listed.py``); any other gets
the decoded config (decoded on a thread when it is large) and builds on the event
loop, reading through the task's IO scope. Either way the task makes at most
TASK_MAX_CALLS calls: a streaming Builder's scan is counted as it feeds
(``feed_calls``), an eager build once it is built.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_server.pipeline.builders import (
    CallBuilder,
    CallList,
    CallStream,
    ListedCallBuilder,
    StreamingCallBuilder,
    check_call_count,
)
from blockx_server.pipeline.context import TaskContext
from blockx_server.worker.offload import Offload


async def build_calls(
    builder: CallBuilder,
    ctx: TaskContext,
    *,
    offload: Offload,
    max_calls: int,
    stream: bool,
) -> CallList | CallStream:
    """The calls of ``ctx.task`` (a prepared stream when ``stream`` and the Builder
    streams); raises PluginError."""
    spec = ctx.task.function_call_config
    size = len(spec.config)
    if isinstance(builder, ListedCallBuilder):
        calls = await offload.run("builder", size, builder.build_listed, spec.config, max_calls)
    else:
        config = await offload.run("builder", size, decode_checked_config, spec.config)
        if stream and isinstance(builder, StreamingCallBuilder):
            return await builder.prepare_stream(ctx, config)
        calls = await builder.build(ctx, config)
    check_call_count(spec.type, len(calls.calls), max_calls)
    return calls


def decode_checked_config(config: str) -> Any:
    """A plug-in config SubmitTask has already checked (``json_bounds.check_json``):
    valid JSON within the depth bound, so it is decoded without checking again."""
    return msgspec.json.decode(config or "{}")
