"""What a Call Builder is: the Builder phase expands ``function_call_config`` into calls.

A Builder is looked up by ``function_call_config.type`` in a ``Builders``;
``blockx_server.pipeline.builders`` registers the ones a Worker has.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec

from blockx_core.calls import RootCall
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError, Plugins


class CallList(msgspec.Struct, frozen=True):
    """Root calls of ``function``, in root order: each with its positional and keyword
    arguments and the context (block number, hash) the Builder gives it."""

    function: str
    calls: list[RootCall]


class _HasFunction(Protocol):
    @property
    def function(self) -> str: ...


Config = TypeVar("Config", bound=_HasFunction)


def decode_config(builder: str, config: Any, kind: type[Config], shape: str) -> Config:
    """A builder's config as ``kind``; PluginError (not retryable) naming ``builder``
    and the expected ``shape`` when it does not fit, or names no function."""
    try:
        decl = msgspec.convert(config, kind)
    except msgspec.ValidationError as exc:
        raise PluginError.of(f"{builder}: {exc}; expected {shape}", retryable=False) from None
    if not decl.function:
        raise PluginError.of(f"{builder}: `function` must not be empty", retryable=False)
    return decl


class CallBuilder(Protocol):
    async def build(self, ctx: TaskContext, config: Any) -> CallList: ...


Builders = Plugins[CallBuilder]
