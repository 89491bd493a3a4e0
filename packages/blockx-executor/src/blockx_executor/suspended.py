"""An ``async def`` call suspended on a BlockX awaitable, until its ResumeCall.

The executor has no event loop: it drives each coroutine by hand (``send`` /
``throw``) inside the call's own ``contextvars.Context``, and anything awaited that
is not ``io.<backend>.<op>(...)`` or ``call(...)`` is thrown back as a TypeError.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from typing import Any, Final


class SuspendedCall:
    """An async call waiting for a ResumeCall."""

    __slots__ = ("budget_ns", "call_id", "consumed_ns", "coro", "ctx", "io_ns", "waiting_io")

    def __init__(
        self,
        call_id: int,
        coro: types.CoroutineType[Any, Any, Any],
        ctx: contextvars.Context,
        budget_ns: int,
    ) -> None:
        self.call_id = call_id
        self.coro = coro
        self.ctx = ctx
        self.budget_ns = budget_ns
        self.consumed_ns = 0
        self.io_ns = 0
        self.waiting_io = True


NOT_AWAITABLE: Final = (
    "cannot await {!r} in a BlockX function: only io.<backend>.<op>(...) and "
    "call(...) from blockx_executor can be awaited (the executor has no event loop)"
)


def close_quietly(call: SuspendedCall) -> None:
    # A function's cleanup code must not take the executor down.
    with contextlib.suppress(BaseException):
        call.ctx.run(call.coro.close)
