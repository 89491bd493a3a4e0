"""``InputsCallConfig``: one call per input object, its fields the keyword arguments.

``{"function", "inputs": [{...}, ...]}``. The specification names this builder
without describing it; this shape is BlockX's own. Inputs are bounded (count and
nesting depth) and every key must be a keyword argument name.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx_core.calls import RootCall
from blockx_executor.results import json_depth
from blockx_server.pipeline.builders.base import CallList, decode_config
from blockx_server.pipeline.builders.listed import (
    Element,
    check_call_count,
    count_listed,
    decode_listed,
)
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError

NAME = "InputsCallConfig"
MAX_INPUTS: Final = 100_000
# Containers nested inside one argument value.
MAX_DEPTH: Final = 32
_SHAPE = '{"function": "<name>", "inputs": [{"<argument>": <value>, ...}, ...], "chain"?: "<name>"}'


class _InputsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    function: str
    inputs: list[Any]
    # The chain its calls' io.blockdb and io.rpc read (blockx_server.pipeline.task_chain).
    chain: str | None = None


class _ListedConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    function: str
    inputs: list[Element]
    chain: str | None = None


def _call_of(i: int, item: Any) -> RootCall:
    if not isinstance(item, dict):
        raise PluginError.of(
            f"{NAME}: inputs[{i}] must be an object of keyword arguments, got {item!r}",
            retryable=False,
        )
    for key in item:
        if not key.isidentifier():
            raise PluginError.of(
                f"{NAME}: inputs[{i}] has key {key!r}, not a keyword argument name", retryable=False
            )
    if any(json_depth(value, stop_past=MAX_DEPTH) > MAX_DEPTH for value in item.values()):
        raise PluginError.of(
            f"{NAME}: inputs[{i}] nests more than {MAX_DEPTH} levels deep", retryable=False
        )
    return RootCall([], dict(item))


class InputsCallConfig:
    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = decode_config(NAME, config, _InputsConfig, _SHAPE)
        if len(decl.inputs) > MAX_INPUTS:
            raise PluginError.of(
                f"{NAME}: {len(decl.inputs)} inputs, more than {MAX_INPUTS}: split the task",
                retryable=False,
            )
        return CallList(decl.function, [_call_of(i, item) for i, item in enumerate(decl.inputs)])

    def build_listed(self, config: str, max_calls: int) -> CallList:
        """The same from the config's JSON text, at most ``max_calls`` calls (see
        ``listed.py``); CPU only."""
        at_most = min(MAX_INPUTS, max_calls)
        count = count_listed(config, "inputs", at_most)
        if count > MAX_INPUTS:
            raise PluginError.of(
                f"{NAME}: more than {MAX_INPUTS} inputs: split the task", retryable=False
            )
        check_call_count(NAME, count, max_calls)
        calls: list[RootCall] = []

        def element(item: Any) -> None:
            calls.append(_call_of(len(calls), item))

        decl = decode_listed(NAME, config, _ListedConfig, _SHAPE, element)
        return CallList(decl.function, calls)
