"""The Calls phase's sans-IO dispatcher: events in, commands out."""

from blockx_core.dispatch._commands import (
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithResult,
    RetireExecutor,
    SendCalls,
)
from blockx_core.dispatch._config import CallRetryPolicy, DispatchConfig
from blockx_core.dispatch._core import DispatcherCore
from blockx_core.dispatch._failures import CallFailure
from blockx_core.dispatch._state import CallUsage
from blockx_core.dispatch._views import CallsWaiting, ExecutorState, RunningCall

__all__ = [
    "CallFailure",
    "CallRetryPolicy",
    "CallUsage",
    "CallsWaiting",
    "CancelCalls",
    "ConvergeTaskCalls",
    "DispatchCommand",
    "DispatchConfig",
    "DispatcherCore",
    "ExecutorState",
    "KillExecutor",
    "ResumeWithResult",
    "RetireExecutor",
    "RunningCall",
    "SendCalls",
]
