"""The call records of one run (``blockx_core.call_record``): every IO request of a
root call, its sub-calls' included, with its answer, kept while the call runs.

The engine feeds a run's ``RunRecords``: ``io`` for each request served (the
request and its answer referenced, the answer as the JSON bytes the backend gave,
never decoded again; encoded only when a record is made), ``resent``
when a root call runs again (a retry, or its executor ended: the attempt's IO is
dropped, the new attempt records its own), ``succeeded`` when a root call returns,
``failed`` when the run fails on one. A run made with ``keep_successes`` false (a
Worker's) drops the IO of a call that succeeded at once, so recording costs memory
only while calls run and for the call that failed; the Sync Invoker's keeps both.
``record`` assembles the finished document: arguments, chain, the code the call
could reach in its pinned epoch, its IO and its ending.
"""

from __future__ import annotations

from typing import Any, Final

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
from blockx_core.failures import CallFailureKind
from blockx_executor import protocol as wire
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome

# What an entry's JSON holds besides its answer, its backend and op names and its
# arguments: ``{"backend":"","op":"","args":[],"answer":}``. With it a running
# call's IO is counted at most at its real size (see ``CallRecording``).
_ENTRY_FRAME: Final = 39


class CallRecording:
    """One attempt of one root call as it runs: its arguments and its IO so far.

    While the call runs its requests and answers are only referenced (the answers
    as the backends' JSON bytes), counted by a lower bound of their encoded size
    that stops recording once past the bound; ``built`` makes the entries of a
    record when one is asked for, bounded exactly by ``RecordBuilder``. So a call
    that succeeds costs a list append per request, never an encoding."""

    __slots__ = ("args", "entries", "held", "index", "kwargs", "truncated")

    def __init__(self, index: int, args: list[Any], kwargs: dict[str, Any] | None) -> None:
        self.index = index
        self.args = args
        self.kwargs = kwargs
        self.entries: list[tuple[wire.IoRequested, IoOutcome]] = []
        self.held = 0  # a lower bound of the entries' encoded size
        self.truncated = False

    def built(self, max_bytes: int) -> RecordBuilder:
        """The record's IO entries, in the order answered, up to ``max_bytes``."""
        builder = RecordBuilder(max_bytes)
        for request, outcome in self.entries:
            answer: Any = None
            error: RecordedError | None = None
            match outcome:
                case IoOk():
                    answer = msgspec.Raw(outcome.value_json)  # the bytes, never decoded
                case IoFailed():
                    error = RecordedError(kind=outcome.kind, message=outcome.message)
            entry = RecordedIo(
                backend=request.backend,
                op=request.op,
                args=request.args,
                kwargs=request.kwargs or {},
                answer=answer,
                error=error,
            )
            if not builder.add(entry):
                break
        builder.truncated = builder.truncated or self.truncated
        return builder


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
        root_id = root[0]
        recording = self.open.get(root_id)
        if recording is None:
            recording = self.open[root_id] = CallRecording(root[1], root[2], root[3])
        if recording.truncated:
            return
        answered = len(outcome.value_json) if isinstance(outcome, IoOk) else len(outcome.message)
        held = recording.held + answered + len(request.backend) + len(request.op) + _ENTRY_FRAME
        if held > self.max_bytes:
            recording.truncated = True
            return
        recording.held = held
        recording.entries.append((request, outcome))

    def resent(self, root_id: int) -> None:
        """The root call runs again from the start: what its last attempt did is gone."""
        self.open.pop(root_id, None)

    def succeeded(self, root_id: int, result: bytes) -> None:
        recording = self.open.pop(root_id, None)
        if recording is not None and self.keep_successes:
            self.successes[recording.index] = (recording, result)

    def failed(self, failure: CallFailure) -> None:
        """The run failed on root call ``failure.index``: keep its recording (an empty
        one for a call that made no IO request; none for a function that does not
        exist: the call never ran)."""
        if failure.kind is CallFailureKind.FUNCTION_NOT_FOUND:
            return
        for root_id, recording in self.open.items():
            if recording.index == failure.index:
                del self.open[root_id]
                break
        else:
            recording = CallRecording(failure.index, failure.args, failure.kwargs)
        self.failures[failure.index] = recording

    def kept_bytes(self, index: int) -> int:
        """About the size of the IO kept for root call ``index`` (JSON bytes)."""
        kept = self.failures.get(index) or self.successes.get(index, (None, b""))[0]
        return 0 if kept is None else kept.held

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
            kept = CallRecording(index, args, None)  # a success without IO
        built = kept.built(self.max_bytes)
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
            io=built.io,
            truncated=built.truncated,
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
