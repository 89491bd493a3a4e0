"""``CallListCallConfig``: the calls are listed in the task itself."""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_core.calls import RootCall
from blockx_server.pipeline.builders.base import CallList, decode_config
from blockx_server.pipeline.context import TaskContext

NAME = "CallListCallConfig"
_SHAPE = '{"function": "<name>", "callList": [[<args>], ...]}'


class _CallListConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    function: str
    call_list: list[list[Any]]


class CallListCallConfig:
    """``{"function": "name", "callList": [[args...], ...]}``: one root call per list."""

    async def build(self, ctx: TaskContext, config: Any) -> CallList:
        decl = decode_config(NAME, config, _CallListConfig, _SHAPE)
        return CallList(decl.function, [RootCall(args) for args in decl.call_list])
