"""``CallListCallConfig``: the calls are listed in the task itself."""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_core.calls import RootCall
from blockx_server.pipeline.builders.base import CallList, decode_config
from blockx_server.pipeline.builders.listed import (
    Element,
    check_call_count,
    count_listed,
    decode_listed,
    json_kind,
)
from blockx_server.pipeline.context import TaskContext

NAME = "CallListCallConfig"
_SHAPE = '{"function": "<name>", "callList": [[<args>], ...], "chain"?: "<name>"}'


class _CallListConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    call_list: list[list[Any]]
    # The chain its calls' io.blockdb and io.rpc read (blockx_server.pipeline.task_chain).
    chain: str | None = None


class _ListedConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    call_list: list[Element]
    chain: str | None = None


class CallListCallConfig:
    """``{"function": "name", "callList": [[args...], ...]}``: one root call per list."""

    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = decode_config(NAME, config, _CallListConfig, _SHAPE)
        return CallList(decl.function, [RootCall(args) for args in decl.call_list])

    def build_listed(self, config: str, max_calls: int) -> CallList:
        """The same from the config's JSON text, at most ``max_calls`` calls (see
        ``listed.py``); CPU only."""
        check_call_count(NAME, count_listed(config, "callList", max_calls), max_calls)
        calls: list[RootCall] = []

        def element(args: Any) -> None:
            if not isinstance(args, list):
                raise TypeError(f"Expected `array`, got `{json_kind(args)}`")
            calls.append(RootCall(args))

        decl = decode_listed(NAME, config, _ListedConfig, _SHAPE, element)
        return CallList(decl.function, calls)
