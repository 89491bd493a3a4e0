"""The call records of one run (``blockx_core.call_record``): every IO request of a
root call, its sub-calls' included, with its answer, kept while the call runs.

The engine feeds a run's ``RunRecords``: ``io`` for each request served (the
answer kept as the JSON bytes the backend gave, never decoded again), ``resent``
when a root call runs again (a retry, or its executor ended: the attempt's IO is
dropped, the new attempt records its own), ``succeeded`` when a root call returns,
``failed`` when the run fails on one. A run made with ``keep_successes`` false (a
Worker's) drops the IO of a call that succeeded at once, so recording costs memory
only while calls run and for the call that failed; the Sync Invoker's keeps both.
``record`` assembles the finished document: arguments, chain, the code the call
could reach in its pinned epoch, its IO and its ending.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_core.call_record import (
    CallRecord,
    RecordBuilder,
    RecordedError,
    RecordedFailure,
    RecordedIo,
)
from blockx_core.code_view import CodeSnapshot
from blockx_core.dispatch import CallFailure
from blockx_executor import protocol as wire
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome


class CallRecording:
    """One attempt of one root call as it runs: its arguments and IO so far."""

    __slots__ = ("args", "builder", "index", "kwargs")

    def __init__(
        self, index: int, args: list[Any], kwargs: dict[str, Any] | None, max_bytes: int
    ) -> None:
        self.index = index
        self.args = args
        self.kwargs = kwargs
        self.builder = RecordBuilder(max_bytes)


class RunRecords:
    """The records of one run's root calls (see the module docstring)."""

    __slots__ = ("failures", "keep_successes", "max_bytes", "modules", "open", "successes")

    def __init__(self, max_bytes: int, *, keep_successes: bool) -> None:
        self.max_bytes = max_bytes
        self.keep_successes = keep_successes
        # Root call id -> the recording of its attempt running now (only calls that
        # made an IO request have one).
        self.open: dict[int, CallRecording] = {}
        # Root index -> the recording and the JSON text of the result.
        self.successes: dict[int, tuple[CallRecording, bytes]] = {}
        # Root index -> the recording of the attempt that failed the call for good.
        self.failures: dict[int, CallRecording] = {}
        # The modules sub-calls resolved to, besides the function's own.
        self.modules: set[str] = set()

    def io(
        self,
        root: tuple[int, int, list[Any], dict[str, Any] | None],
        request: wire.IoRequested,
        outcome: IoOutcome,
    ) -> None:
        """A request of the root call ``root`` (``DispatcherCore.root_call``) answered."""
        root_id, index, args, kwargs = root
        recording = self.open.get(root_id)
        if recording is None:
            recording = self.open[root_id] = CallRecording(index, args, kwargs, self.max_bytes)
        builder = recording.builder
        if builder.truncated:
            return
        answer: Any = None
        error: RecordedError | None = None
        match outcome:
            case IoOk():
                answer = msgspec.Raw(outcome.value_json)  # the bytes, never decoded
            case IoFailed():
                error = RecordedError(kind=outcome.kind, message=outcome.message)
        builder.add(
            RecordedIo(
                backend=request.backend,
                op=request.op,
                args=request.args,
                kwargs=request.kwargs or {},
                answer=answer,
                error=error,
            )
        )

    def resent(self, root_id: int) -> None:
        """The root call runs again from the start: what its last attempt did is gone."""
        self.open.pop(root_id, None)

    def succeeded(self, root_id: int, result: bytes) -> None:
        recording = self.open.pop(root_id, None)
        if recording is not None and self.keep_successes:
            self.successes[recording.index] = (recording, result)

    def failed(self, failure: CallFailure) -> None:
        """The run failed on root call ``failure.index``: keep its recording (an empty
        one for a call that made no IO request)."""
        for root_id, recording in self.open.items():
            if recording.index == failure.index:
                del self.open[root_id]
                break
        else:
            recording = CallRecording(failure.index, failure.args, failure.kwargs, self.max_bytes)
        self.failures[failure.index] = recording

    def kept_bytes(self, index: int) -> int:
        """The size of the IO kept for root call ``index`` (JSON bytes)."""
        kept = self.failures.get(index) or self.successes.get(index, (None, b""))[0]
        return 0 if kept is None else kept.builder.size

    def record(
        self,
        index: int,
        *,
        function: str,
        snapshot: CodeSnapshot,
        chain: str,
        ending: RecordedFailure | bytes,
        args: list[Any] | None = None,
    ) -> CallRecord | None:
        """Root call ``index``'s record, ended by a failure or the JSON text of its
        result; for a call that succeeded without IO, ``args`` are its arguments
        (None: no record)."""
        kept = self.failures.get(index)
        if kept is None:
            success = self.successes.get(index)
            kept = None if success is None else success[0]
        if kept is None:
            if args is None or not isinstance(ending, bytes):
                return None
            kept = CallRecording(index, args, None, 0)  # a success without IO
        failure = None if isinstance(ending, bytes) else ending
        result = msgspec.Raw(ending) if isinstance(ending, bytes) else None
        return CallRecord(
            function=function,
            args=kept.args,
            kwargs=kept.kwargs or {},
            chain=chain,
            code_epoch=snapshot.epoch,
            code_digest=snapshot.digest,
            code=self.code(function, snapshot),
            io=kept.builder.io,
            truncated=kept.builder.truncated,
            result=result,
            failure=failure,
        )

    def code(self, function: str, snapshot: CodeSnapshot) -> dict[str, str]:
        """Module name -> source of every module the run's calls could reach: the
        function's module, the sub-calls', and the siblings they import."""
        code: dict[str, str] = {}
        modules = set(self.modules)
        own = snapshot.functions.get(function)
        if own is not None:
            modules.add(own)
        for name in sorted(modules):
            source = snapshot.modules.get(name)
            if source is None:
                continue
            code[source.module] = source.source
            for sibling, imported in source.package.items():
                code[sibling] = imported.source
        return dict(sorted(code.items()))


def failure_ending(failure: CallFailure) -> RecordedFailure:
    return RecordedFailure(kind=failure.kind, message=failure.message)
