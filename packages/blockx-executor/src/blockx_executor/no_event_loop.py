"""asyncio inside a BlockX function: a clear ``TypeError`` instead of asyncio's own
``RuntimeError: no running event loop``.

The executor drives coroutines by hand and has no event loop. While it runs a
coroutine step, ``NO_EVENT_LOOP`` installs a stand-in as the thread's running
loop, so ``asyncio.sleep(1)``, ``asyncio.gather``, ``asyncio.Event().wait()``,
aiohttp and anything else that asks asyncio for its loop gets a ``TypeError`` that
says what to await instead. Only during coroutine steps: a plain ``def`` that runs
its own ``asyncio.run(...)`` is left alone.
"""

from __future__ import annotations

import sys
from typing import Final, NoReturn

_MESSAGE: Final = (
    "asyncio cannot be used in a BlockX function (it asked the event loop for {}): "
    "the executor has no event loop. Await io.<backend>.<op>(...) or call(...) from "
    "blockx_executor instead; there is no sleep to await (time.sleep blocks the "
    "executor and counts against CALL_WALL_LIMIT_MS)"
)


class _NoLoop:
    """Every attribute a loop would have raises TypeError."""

    __slots__ = ()

    def __getattr__(self, name: str) -> NoReturn:
        raise TypeError(_MESSAGE.format(name))

    def __repr__(self) -> str:
        return "<no event loop: this is a BlockX executor>"


_NO_LOOP: Final = _NoLoop()


class _NoEventLoop:
    """``with NO_EVENT_LOOP:`` the thread's running loop is the stand-in.

    asyncio is not imported for this (it would cost every executor start-up time
    and memory): only code that imported it can ask it for a loop. A step that
    imports it midway is covered by :meth:`after_import`, which the executor's
    importer calls after each import of a function module."""

    __slots__ = ("_inside",)

    def __init__(self) -> None:
        self._inside = False

    @property
    def inside(self) -> bool:
        """The executor is running a coroutine step: what the step awaits reaches it."""
        return self._inside

    def __enter__(self) -> None:
        self._inside = True
        self.after_import()

    def after_import(self) -> None:
        if self._inside:
            events = sys.modules.get("asyncio.events")
            if events is not None:
                events._set_running_loop(_NO_LOOP)

    def __exit__(self, *exc: object) -> None:
        self._inside = False
        events = sys.modules.get("asyncio.events")
        if events is not None:
            events._set_running_loop(None)


NO_EVENT_LOOP: Final = _NoEventLoop()
