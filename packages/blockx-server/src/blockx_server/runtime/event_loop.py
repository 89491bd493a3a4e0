"""Which event loop a server program runs on: asyncio's own, or uvloop's.

uvloop is optional (``uv sync --extra uvloop``, or ``pip install uvloop``) and
chosen explicitly with ``BLOCKX_EVENT_LOOP=uvloop``: a process does not change
loops because a package happens to be installed. On this project's 2-core test
machine it gave no consistent gain (bench/task_latency_bench.py ``--event-loop``,
alternated with asyncio): the time goes to HTTP/2 and protobuf in Python, not to
the loop.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from blockx_server.runtime.settings import InvalidValue, Setting

T = TypeVar("T")


class EventLoop(enum.Enum):
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


def event_loop(raw: str) -> EventLoop:
    try:
        choice = EventLoop(raw.strip().lower())
    except ValueError:
        names = ", ".join(loop.value for loop in EventLoop)
        raise InvalidValue(f"must be one of {names} (got {raw!r})") from None
    if choice is EventLoop.UVLOOP and importlib.util.find_spec("uvloop") is None:
        raise InvalidValue("is uvloop, but uvloop is not installed (uv sync --extra uvloop)")
    return choice


EVENT_LOOP: Final = Setting(
    name="BLOCKX_EVENT_LOOP",
    default=EventLoop.ASYNCIO,
    parse=event_loop,
    help="The event loop: asyncio, or uvloop when it is installed.",
    shown_default="asyncio",
)


def loop_factory(choice: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    match choice:
        case EventLoop.ASYNCIO:
            return None
        case EventLoop.UVLOOP:
            import uvloop

            return uvloop.new_event_loop


def run_on(choice: EventLoop, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
