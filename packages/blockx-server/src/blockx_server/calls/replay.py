"""Replay: one call of a call record run again, offline, in a real executor.

A ``Replayer`` owns a CallEngine with its executor processes (the pool code and the
sandbox a Worker uses) and runs calls against a record: every IO request is
answered by the ``localtestservice`` backend from the record's IO (a request it
does not hold fails NOT_FOUND), sub-calls run as they did. The code is the
record's own (the sources of its code epoch, so an exception is raised at the same
line) or a source set the caller gives (a functions directory being edited, to
test it against a recording). The call ends as a call does: its value, or its
failure with the same kind and message (type, message and traceback of a
USER_ERROR).

A replay is one attempt: no retry of an executor lost, since a replay is for
seeing what happens. Replays may run concurrently on one Replayer, each with its
own record.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, TypeAlias, assert_never

import msgspec

from blockx_core.call_record import CallRecord, InvalidRecord, decode_record
from blockx_core.calls import RootCall
from blockx_core.code_view import CodeLoadError, build_snapshot
from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsConverged,
    CallsFailed,
    CallUsage,
    DispatchConfig,
)
from blockx_core.failures import Failure
from blockx_executor import protocol as wire
from blockx_server.calls.engine import CallEngine, CallEngineConfig
from blockx_server.calls.executor_pool import ExecutorPoolConfig
from blockx_server.calls.functions import DirectoryFunctionStore, FunctionStoreError
from blockx_server.io.backends.localtestservice import LocalTestService, ReplayRouter
from blockx_server.io.errors import IoOutcome
from blockx_server.io.scope import TaskIoScope

# The budget of a replayed call: CALL_DEADLINE_MS's default. IO answered from a
# record costs almost nothing, so a call that ran within its budget does here too.
DEFAULT_REPLAY_BUDGET_MS: Final = 5000
# What a replay keeps of the call's printed output at most.
MAX_OUTPUT_CHARS: Final = 1024 * 1024
# Executors start in about a second; a machine under load takes longer.
READY_TIMEOUT_S: Final = 60.0
# The largest record file read (a Worker keeps at most CALL_RECORD_MAX_BYTES of IO,
# 4 MiB by default; an edited fixture may grow).
MAX_RECORD_FILE_BYTES: Final = 256 * 1024 * 1024

_decode = msgspec.json.Decoder().decode


class ReplayRefused(Exception):
    """A replay that cannot start (no code, a source set that does not load); ``str()``
    is the one line to show."""


class ReplayReturned(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The call returned ``value``. ``served``: IO requests answered from the record;
    ``output``: what the call printed."""

    value: Any
    served: int = 0
    output: str = ""


class ReplayFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The call failed as a call fails: ``failure.kind`` is a CallFailureKind and
    ``failure.message`` the executor's text (traceback included)."""

    failure: Failure
    served: int = 0
    output: str = ""


ReplayOutcome: TypeAlias = ReplayReturned | ReplayFailed


class RaisedAt(msgspec.Struct, frozen=True, kw_only=True):
    """Where a failure was raised: the innermost frame of its traceback (a user's
    file, as ``chain.py``, its line and function)."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}, in {self.function}"


_FRAME: Final = re.compile(r'^  File "([^"\n]+)", line (\d+), in (\S+)$', re.MULTILINE)


def raised_at(message: str) -> RaisedAt | None:
    """The innermost frame of a failure message's traceback, or None without one."""
    frames = _FRAME.findall(message)
    if not frames:
        return None
    file, line, function = frames[-1]
    return RaisedAt(file=file, line=int(line), function=function)


def same_ending(record: CallRecord, outcome: ReplayOutcome) -> bool:
    """Whether the replay ended as the recorded call did: the same value, or the same
    failure kind and exception raised at the same place. (A record holds a value
    or a failure; one that holds neither returned None.)"""
    recorded = record.failure
    match outcome:
        case ReplayReturned():
            result = record.result
            if isinstance(result, msgspec.Raw):  # a record fresh from the engine
                result = _decode(result)
            return recorded is None and outcome.value == result
        case ReplayFailed():
            failure = outcome.failure
            return (
                recorded is not None
                and recorded.kind == failure.kind
                and _headline(recorded.message) == _headline(failure.message)
                and raised_at(recorded.message) == raised_at(failure.message)
            )
        case _:
            assert_never(outcome)


def _headline(message: str) -> str:
    return message.split("\n", 1)[0]


def replay_engine_config(executors: int = 1, *, sandbox: bool = True) -> CallEngineConfig:
    """One attempt per call, the default budget and executors sandboxed as a Worker's."""
    return CallEngineConfig(
        dispatch=DispatchConfig(
            call_deadline_ms=DEFAULT_REPLAY_BUDGET_MS,
            retry=CallRetryPolicy(max_attempts=1),
        ),
        pool=ExecutorPoolConfig(count=executors, heartbeat_interval_ms=200, sandbox=sandbox),
    )


async def load_functions(directory: str | os.PathLike[str]) -> dict[str, str]:
    """A functions directory's sources, as a Worker reads FUNCTIONS_DIR;
    ReplayRefused naming what is wrong."""
    try:
        return await DirectoryFunctionStore(directory).load()
    except FunctionStoreError as exc:
        raise ReplayRefused(str(exc)) from None


def read_record(path: str | os.PathLike[str]) -> CallRecord:
    """A record file (``blockx invoke --record``, ``blockx replay``, a fixture);
    ReplayRefused naming the file and what is wrong."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_RECORD_FILE_BYTES + 1)
    except OSError as exc:
        raise ReplayRefused(f"cannot read the record {os.fspath(path)!r}: {exc.strerror}") from None
    if len(data) > MAX_RECORD_FILE_BYTES:
        raise ReplayRefused(
            f"the record {os.fspath(path)!r} is larger than {MAX_RECORD_FILE_BYTES} bytes"
        )
    try:
        return decode_record(data)
    except InvalidRecord as exc:
        raise ReplayRefused(f"{os.fspath(path)}: {exc}") from None


class _Output:
    """The CallObserver of one replay: keeps what the call printed."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._chars = 0

    def call_finished(self, call_id: int, cpu_us: int, io_us: int) -> None:
        pass

    def calls_measured(self, usage: CallUsage) -> None:
        pass

    def call_output(self, call_id: int, text: str) -> None:
        room = MAX_OUTPUT_CHARS - self._chars
        if room > 0:
            self._parts.append(text[:room])
            self._chars += min(len(text), room)

    def io_traced(self, call_id: int, request: wire.IoRequested, outcome: IoOutcome) -> None:
        pass

    def text(self) -> str:
        return "".join(self._parts)


class Replayer:
    """Executors ready to replay calls: ``async with Replayer() as replayer:
    await replayer.replay(record)``."""

    def __init__(self, config: CallEngineConfig | None = None) -> None:
        self._engine = CallEngine(config or replay_engine_config())
        self._ids = itertools.count(1)
        self._started = False

    async def start(self) -> None:
        await self._engine.start()
        self._started = True
        async with asyncio.timeout(READY_TIMEOUT_S):
            await self._engine.wait_ready()

    async def close(self) -> None:
        if self._started:
            self._started = False
            await self._engine.close()

    async def __aenter__(self) -> Replayer:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def replay(
        self,
        record: CallRecord,
        *,
        code: Mapping[str, str] | None = None,
        function: str | None = None,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        budget_ms: int | None = None,
    ) -> ReplayOutcome:
        """Run ``function(*args, **kwargs)`` (the record's call by default) with the
        record's IO answers, in ``code`` (the record's by default)."""
        sources = record.code if code is None else code
        if not sources:
            raise ReplayRefused(
                "the record holds no code: give the functions directory to run it with"
            )
        try:
            snapshot = build_snapshot(record.code_epoch, sources)
        except CodeLoadError as exc:
            raise ReplayRefused(f"the code does not load: {'; '.join(exc.problems)}") from None
        service = LocalTestService.of(record)
        task_id = f"replay-{next(self._ids)}"
        scope = TaskIoScope(
            ReplayRouter(service), task_id, chain=record.chain or None, code_epoch=record.code_epoch
        )
        root = RootCall(
            list(record.args if args is None else args),
            dict(record.kwargs if kwargs is None else kwargs),
        )
        output = _Output()
        try:
            converged = await self._engine.run_calls(
                task_id,
                snapshot,
                scope,
                function or record.function,
                [root],
                observer=output,
                debug=True,
                budget_ms=budget_ms,
            )
        finally:
            scope.close()
        match converged:
            case CallsConverged(outputs=outputs):
                return ReplayReturned(
                    value=_decode(outputs[0].value_json),
                    served=service.served,
                    output=output.text(),
                )
            case CallsFailed(failed_call=failed):
                failure = (
                    Failure(converged.failure_code, converged.failure_message, False)
                    if failed is None
                    else failed.failure
                )
                return ReplayFailed(failure=failure, served=service.served, output=output.text())
            case _:
                assert_never(converged)


async def replay_once(
    record: CallRecord,
    *,
    code: Mapping[str, str] | None = None,
    config: CallEngineConfig | None = None,
    budget_ms: int | None = None,
) -> ReplayOutcome:
    """Start executors, replay the record's call, stop them."""
    async with Replayer(config) as replayer:
        return await replayer.replay(record, code=code, budget_ms=budget_ms)
