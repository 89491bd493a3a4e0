"""The Calls phase's sans-IO dispatcher: events in, commands out."""

from typing import TYPE_CHECKING

from blockx_core.dispatch._commands import (
    AbortCall,
    CallsConverged,
    CallsFailed,
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithIo,
    ResumeWithResult,
    RetireExecutor,
    SendCalls,
    SubCallFailed,
    SubCallResult,
    SubCallReturned,
)
from blockx_core.dispatch._config import CallRetryPolicy, DispatchConfig
from blockx_core.dispatch._failures import CallFailure
from blockx_core.dispatch._state import CallUsage
from blockx_core.dispatch._views import CallsWaiting, ExecutorState, RunningCall

if TYPE_CHECKING:
    from blockx_core.dispatch._core import DispatcherCore


def __getattr__(name: str) -> object:
    # The engine is loaded on first use: a client that reads only the views (the
    # CLI listing a Worker's executors) never pays for it.
    if name == "DispatcherCore":
        from blockx_core.dispatch._core import DispatcherCore

        return DispatcherCore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AbortCall",
    "CallFailure",
    "CallRetryPolicy",
    "CallUsage",
    "CallsConverged",
    "CallsFailed",
    "CallsWaiting",
    "CancelCalls",
    "ConvergeTaskCalls",
    "DispatchCommand",
    "DispatchConfig",
    "DispatcherCore",
    "ExecutorState",
    "KillExecutor",
    "ResumeWithIo",
    "ResumeWithResult",
    "RetireExecutor",
    "RunningCall",
    "SendCalls",
    "SubCallFailed",
    "SubCallResult",
    "SubCallReturned",
]
