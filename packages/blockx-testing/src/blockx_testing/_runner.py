"""``run_function`` and the executors behind it, for synchronous callers (a test).

``Executors`` start a ``Replayer`` (real executor processes, sandboxed as a
Worker's) on an event loop of their own thread the first time they are used, and
keep it until ``close``; a ``ReplayRunner`` replays calls on them. The executors
start once for a test session, not once per test, and a test needs no event loop
of its own (an async test may call it too). ``run_function`` uses the process's
executors, closed at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypedDict, TypeVar, Unpack

from blockx_core.call_record import CallRecord
from blockx_core.failures import Failure
from blockx_executor import CallError
from blockx_server.calls.engine import CallEngineConfig
from blockx_server.calls.replay import (
    Replayer,
    ReplayFailed,
    ReplayOutcome,
    ReplayReturned,
    load_functions,
    read_record,
)

T = TypeVar("T")

Path = str | os.PathLike[str]


class ReplayOptions(TypedDict, total=False):
    """What a replay is run with besides the call (``ReplayRunner.outcome``)."""

    fixture: Path | CallRecord | None
    functions: Path | None
    budget_ms: int | None


class CallFailed(CallError):
    """The function's call failed, as a call fails: ``kind`` (USER_ERROR,
    IO_ERROR, BUDGET_EXCEEDED, ...), ``message`` (the exception, its traceback
    with the user's files and lines), and the whole ``failure``."""

    def __init__(self, failure: Failure, output: str = "") -> None:
        super().__init__(str(failure.kind), failure.message, retryable=failure.retryable)
        self.failure = failure
        self.output = output


def load_fixture(path: Path) -> CallRecord:
    """A call record file (``blockx invoke --record``); ReplayRefused naming the file
    and what is wrong."""
    return read_record(path)


class Executors:
    """A Replayer on an event loop of its own thread, started at the first replay
    and kept until ``close``. Thread-safe."""

    def __init__(self, config: CallEngineConfig | None = None) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._replayer: Replayer | None = None

    def run(self, replay: Callable[[Replayer], Coroutine[Any, Any, T]]) -> T:
        """``replay(replayer)`` on the executors' loop; blocks until it is done."""
        with self._lock:
            if self._replayer is None:
                self._start()
            loop, replayer = self._loop, self._replayer
        assert loop is not None
        assert replayer is not None
        return asyncio.run_coroutine_threadsafe(replay(replayer), loop).result()

    def close(self) -> None:
        with self._lock:
            loop, thread, replayer = self._loop, self._thread, self._replayer
            self._loop = self._thread = self._replayer = None
        if loop is None or thread is None:
            return
        try:
            if replayer is not None:
                asyncio.run_coroutine_threadsafe(replayer.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        # The executors get a parent-death signal bound to this thread: it lives
        # until close().
        thread = threading.Thread(target=loop.run_forever, name="blockx-replay", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        replayer = Replayer(self._config)
        asyncio.run_coroutine_threadsafe(replayer.__aenter__(), loop).result()
        self._replayer = replayer


class ReplayRunner:
    """Replays calls on ``executors``; ``run`` and ``outcome`` block until the call
    ends. ``functions``: the functions directory of a call that names none (else
    the fixture's code)."""

    def __init__(self, executors: Executors, *, functions: Path | None = None) -> None:
        self.executors = executors
        self.functions = functions

    def outcome(
        self,
        function: str | None = None,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[ReplayOptions],
    ) -> ReplayOutcome:
        """Run ``function(*args, **kwargs)`` in a real executor, its IO answered by
        ``fixture`` (a call record or its file; none: every request fails
        NOT_FOUND), with the code of ``functions`` (a functions directory) or else
        the fixture's, within ``budget_ms``. ``function`` and ``args`` default to the
        fixture's call."""
        record = _record(function, options.get("fixture"))
        if function not in (None, record.function):
            # Another function than the fixture's: none of the fixture's arguments.
            args = [] if args is None else args
            kwargs = {} if kwargs is None else kwargs
        functions = options.get("functions") or self.functions
        budget_ms = options.get("budget_ms")

        async def replay(replayer: Replayer) -> ReplayOutcome:
            code = None if functions is None else await load_functions(functions)
            return await replayer.replay(
                record, code=code, function=function, args=args, kwargs=kwargs, budget_ms=budget_ms
            )

        return self.executors.run(replay)

    def run(
        self,
        function: str | None = None,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Unpack[ReplayOptions],
    ) -> Any:
        """``outcome``'s value, or CallFailed when the call failed."""
        outcome = self.outcome(function, args, kwargs, **options)
        match outcome:
            case ReplayReturned():
                return outcome.value
            case ReplayFailed():
                raise CallFailed(outcome.failure, outcome.output)


def _record(function: str | None, fixture: Path | CallRecord | None) -> CallRecord:
    if isinstance(fixture, CallRecord):
        return fixture
    if fixture is not None:
        return load_fixture(fixture)
    if function is None:
        raise ValueError("name the function to run, or give a fixture whose call to replay")
    return CallRecord(function=function, args=[])


_DEFAULT = ReplayRunner(Executors())
atexit.register(_DEFAULT.executors.close)


def default_runner() -> ReplayRunner:
    """The process's runner (run_function's and the pytest plugin's); its executors
    start at its first replay."""
    return _DEFAULT


def run_function(
    function: str | None = None,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    **options: Unpack[ReplayOptions],
) -> Any:
    """Run ``function(*args, **kwargs)`` offline in a real executor (the sandbox of a
    Worker's), every IO request answered from ``fixture`` (a call record file from
    ``blockx invoke --record`` or ``blockx replay``; a request it does not hold
    fails NOT_FOUND), with the code of ``functions`` (a functions directory) or
    else the fixture's own. Returns the call's value; raises CallFailed as the call
    fails (its kind, and the exception with its traceback)."""
    return _DEFAULT.run(function, args, kwargs, **options)
