"""Why a call attempt fails, and whether calling again may help."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from blockx_core.failures import CallFailureKind, Failure

if TYPE_CHECKING:
    from blockx_core.dispatch._state import Call


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
    # The call's own arguments (what a record of the failed call replays).
    args: list[Any] = msgspec.field(default_factory=list)
    kwargs: dict[str, Any] | None = None

    @property
    def failure(self) -> Failure:
        """The failure as every layer hands it on."""
        return Failure(self.kind, self.message, self.retryable)


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
