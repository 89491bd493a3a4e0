"""The Writer Plugins a Worker has: one module each, one registration line each."""

from blockx_server.pipeline.writers.base import (
    WriterError,
    WriterPlugin,
    Writers,
    failed_writer_result,
)
from blockx_server.pipeline.writers.return_value import ReturnValueResultHandler


def default_writers() -> Writers:
    writers = Writers("Writer Plugin")
    # The Runtime page spells it ReturnValueHandler.
    writers.register(
        "ReturnValueResultHandler", ReturnValueResultHandler(), aliases=["ReturnValueHandler"]
    )
    return writers


__all__ = [
    "WriterError",
    "WriterPlugin",
    "Writers",
    "default_writers",
    "failed_writer_result",
]
