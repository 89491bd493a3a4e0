"""The Call Builders a Worker has: one module each, one registration line each."""

from blockx_server.pipeline.builders.base import (
    BuilderError,
    BuilderRegistry,
    CallBuilder,
    CallList,
)
from blockx_server.pipeline.builders.call_list import CallListCallConfig


def default_builders() -> BuilderRegistry:
    builders = BuilderRegistry("Call Builder")
    builders.register("CallListCallConfig", CallListCallConfig())
    return builders


__all__ = ["BuilderError", "BuilderRegistry", "CallBuilder", "CallList", "default_builders"]
