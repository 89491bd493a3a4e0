"""The Calls phase's sans-IO dispatcher: events in, commands out."""

from blockx_core.dispatch._commands import (
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    KillExecutor,
    ResumeWithResult,
    SendCalls,
)
from blockx_core.dispatch._config import CallFailureKind, CallRetryPolicy, DispatchConfig
from blockx_core.dispatch._core import DispatcherCore

__all__ = [
    "CallFailureKind",
    "CallRetryPolicy",
    "CancelCalls",
    "ConvergeTaskCalls",
    "DispatchCommand",
    "DispatchConfig",
    "DispatcherCore",
    "KillExecutor",
    "ResumeWithResult",
    "SendCalls",
]
