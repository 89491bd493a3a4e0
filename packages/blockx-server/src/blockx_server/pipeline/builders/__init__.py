"""The Call Builders a Worker has: one module each, one registration line each."""

from blockx_server.pipeline.builders.base import (
    BuilderError,
    Builders,
    CallBuilder,
    CallList,
)
from blockx_server.pipeline.builders.call_list import CallListCallConfig


def default_builders() -> Builders:
    builders = Builders("Call Builder")
    builders.register("CallListCallConfig", CallListCallConfig())
    return builders


__all__ = ["BuilderError", "Builders", "CallBuilder", "CallList", "default_builders"]
