"""Why a call attempt fails, and whether calling again may help."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from blockx_core.dispatch._state import Call


class CallFailureKind(enum.StrEnum):
    """Why one call attempt failed."""

    # The function raised (its type, message and traceback are in the message).
    USER_ERROR = "USER_ERROR"
    # The module does not compile or its top level raised.
    COMPILE_ERROR = "COMPILE_ERROR"
    FUNCTION_NOT_FOUND = "FUNCTION_NOT_FOUND"
    # The return value is not JSON-compatible data.
    BAD_RESULT = "BAD_RESULT"
    # CPU + IO time over CallDeadlineMs.
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    # The executor process died or was killed while the call was on it.
    EXECUTOR_LOST = "EXECUTOR_LOST"
    # An IO read failed and the function did not handle it.
    IO_ERROR = "IO_ERROR"
    # The function attempted a write; writes go through a Writer Plugin.
    WRITE_FORBIDDEN = "WRITE_FORBIDDEN"
    # The call's arguments (or a sub-call's, an IO request's) cannot be sent between
    # the Worker and an executor: an object with no msgpack type, a lone surrogate.
    BAD_ARGUMENTS = "BAD_ARGUMENTS"


# Whether calling again may help, per failure kind (a Sync Invoker answer's
# ``retryable``; the retry policy's CALL_RETRY_ON is a separate, operator choice).
RETRYABLE: Final[Mapping[CallFailureKind, bool]] = {
    CallFailureKind.USER_ERROR: False,
    CallFailureKind.COMPILE_ERROR: False,
    CallFailureKind.FUNCTION_NOT_FOUND: False,
    CallFailureKind.BAD_RESULT: False,
    CallFailureKind.BUDGET_EXCEEDED: False,
    CallFailureKind.WRITE_FORBIDDEN: False,
    CallFailureKind.BAD_ARGUMENTS: False,
    # The executor process died (memory limit, a kill): a new attempt gets a fresh one.
    CallFailureKind.EXECUTOR_LOST: True,
    # A read the function did not handle failed; backends fail transiently. An IO
    # error that fails the same way every time (UNKNOWN_BACKEND, BAD_REQUEST, ...)
    # comes with ``retryable=False`` from the executor and overrides this.
    CallFailureKind.IO_ERROR: True,
}


class CallFailure(msgspec.Struct, frozen=True, kw_only=True):
    """The root call that failed a task for good: its index, kind and own message
    (the function's exception and traceback, the budget text, ...)."""

    index: int
    kind: CallFailureKind
    message: str
    attempts: int = 1
    # May the same call succeed if run again (the kind's RETRYABLE entry, unless the
    # attempt said a retry cannot succeed).
    retryable: bool = False


def failure_text(call: Call, kind: CallFailureKind, message: str) -> str:
    """The CALL_FAILED message for people: which root call, how often, why."""
    attempts = f" after {call.attempt} attempts" if call.attempt > 1 else ""
    return (
        f"call #{call.root_index} {call.function}({_short_args(call.args, call.kwargs)}) "
        f"failed{attempts}: {kind.value}: {message}"
    )


def _short_args(args: list[Any], kwargs: dict[str, Any] | None, limit: int = 120) -> str:
    parts = [_short_repr(a) for a in args]
    if kwargs:
        parts += [f"{k}={_short_repr(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_repr(value: Any) -> str:
    try:
        return repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"<{type(value).__name__}>"
