"""What a Call Builder is: the Builder phase expands ``function_call_config`` into calls.

A Builder is looked up by ``function_call_config.type`` in a ``BuilderRegistry``;
``blockx_server.pipeline.builders`` registers the ones a Worker has.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.registry import Named


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


BuilderRegistry = Named[CallBuilder]
