"""``CallListCallConfig``: the calls are listed in the task itself."""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_core.calls import RootCall
from blockx_server.pipeline.builders.base import BuilderError, CallList
from blockx_server.pipeline.context import TaskContext


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
        return CallList(decl.function, [RootCall(args) for args in decl.call_list])
