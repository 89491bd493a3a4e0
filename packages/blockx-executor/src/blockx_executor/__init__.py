"""blockx_executor: the Python Executor of BlockX and the API functions use.

User functions import from here::

    from blockx_executor import io, call, function, current_call, IoError, CallError

The executor process itself is ``python -m blockx_executor`` (started by a Worker
or the Sync Invoker, never by hand); see ``blockx_executor.runner``.
"""

from blockx_executor.api import (
    ApiError,
    CallError,
    CallInfo,
    FunctionHandle,
    IoError,
    call,
    current_call,
    function,
    in_call,
    io,
)

__all__ = [
    "ApiError",
    "CallError",
    "CallInfo",
    "FunctionHandle",
    "IoError",
    "call",
    "current_call",
    "function",
    "in_call",
    "io",
]
