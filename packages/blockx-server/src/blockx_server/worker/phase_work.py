"""The work of each phase, under its admission semaphore: the Builder phase
(BUILDER_SLOTS), the Calls phase (EXECUTOR_TASK_SLOTS, and a streaming Builder's
scan, which runs inside it, also under SCAN_SLOTS) and the Writer phase
(PLUGIN_SLOTS). Each returns the phase's ``PhaseOutcome`` (``PhaseSucceeded`` or
``PhaseFailed``); the Orchestrator hands it
to the core, which decides what comes next. The Writer phase says when its plug-in
gets the outputs (``writer_started``): a CancelTask after that lets the write end.

A streamed task written by BlockBundleWriteResultHandler commits its finished
bundles during the Calls phase (``CommittingSink``, ``BundleCommitter``), a
deviation from the specification's order documented in docs/worker.md; a task
that fails after such commits lists them in its plugin results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import assert_never

import msgspec

from blockx_core.call_record import encode_record
from blockx_core.calls import RootCall
from blockx_core.dispatch import CallFailure, CallsConverged, CallsFailed
from blockx_core.failures import Failure, FailureCode
from blockx_core.task import PluginResult
from blockx_core.worker import PhaseFailed, PhaseOutcome, PhaseSucceeded
from blockx_server.calls.engine import CallEngine
from blockx_server.calls.recording import RunRecords, failure_ending
from blockx_server.calls.run import CallRun
from blockx_server.pipeline.builders import (
    DEFAULT_TASK_MAX_CALLS,
    CallBuilder,
    CallList,
    PluginError,
    StreamBuildConfig,
    feed_calls,
)
from blockx_server.pipeline.builders.streaming import RootSink
from blockx_server.pipeline.writers import WriterPlugin, failed_writer_result
from blockx_server.pipeline.writers.block_bundle_write import (
    BlockBundleWriteResultHandler,
    BundleCommitter,
)
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.worker.build_phase import build_calls, decode_checked_config
from blockx_server.worker.call_progress import ProgressCounter
from blockx_server.worker.call_records import CallRecordStore
from blockx_server.worker.metrics import FunctionCalls
from blockx_server.worker.offload import Offload
from blockx_server.worker.task_log import TaskLog
from blockx_server.worker.task_runtime import TaskRuntime

log = logging.getLogger(__name__)


class AdmissionConfig(msgspec.Struct, frozen=True, kw_only=True):
    builder_slots: int = 16
    executor_task_slots: int = 32
    writer_slots: int = 16
    # Root calls one task may make (TASK_MAX_CALLS), streamed ones included.
    task_max_calls: int = DEFAULT_TASK_MAX_CALLS


class PhaseWork:
    """Runs one phase's work for a task's job; see the module docstring."""

    def __init__(
        self,
        engine: CallEngine,
        admission: AdmissionConfig,
        offload: Offload,
        stream_build: StreamBuildConfig,
        task_log: TaskLog,
        progress: ProgressCounter,
        writer_started: Callable[[str], None],
        function_calls: Callable[[str], FunctionCalls] | None = None,
        call_records: CallRecordStore | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self.engine = engine
        # Where the records of the calls that fail tasks are kept (None: not recorded).
        self.call_records = call_records
        self.progress = progress
        # Told as a Writer Plugin gets a task's outputs (from then a cancel lets it end).
        self._writer_started = writer_started
        self.max_calls = admission.task_max_calls
        self.offload = offload
        self.stream_build = stream_build
        self.task_log = task_log
        self._builder_sem = asyncio.Semaphore(admission.builder_slots)
        self._executor_sem = asyncio.Semaphore(admission.executor_task_slots)
        self._writer_sem = asyncio.Semaphore(admission.writer_slots)
        self._scan_sem = asyncio.Semaphore(stream_build.scan_slots)
        # Sees the calls of each Calls phase, by function (the per-function metrics).
        self._function_calls = function_calls

    async def builder(self, runtime: TaskRuntime, builder: CallBuilder) -> PhaseOutcome:
        async with self._builder_sem:
            assert runtime.ctx is not None
            try:
                calls = await build_calls(
                    builder,
                    runtime.ctx,
                    offload=self.offload,
                    max_calls=self.max_calls,
                    stream=self.stream_build.enabled,
                )
            except PluginError as exc:
                return _builder_failed(exc)
        runtime.calls = calls
        self.task_log.function_known(runtime.task.task_id, calls.function)
        if not isinstance(calls, CallList):
            return PhaseSucceeded()  # streamed: the count is known after the scan
        return PhaseSucceeded(call_count=len(calls.calls))

    async def calls(self, runtime: TaskRuntime, writer: WriterPlugin | None = None) -> PhaseOutcome:
        ctx, calls = runtime.ctx, runtime.calls
        assert ctx is not None
        assert calls is not None
        committer = None
        handler = runtime.task.result_handler
        if (
            not isinstance(calls, CallList)
            and isinstance(writer, BlockBundleWriteResultHandler)
            and handler is not None
        ):
            committer = await self._committer(runtime, handler.config)
        observer = None if self._function_calls is None else self._function_calls(calls.function)
        counted = self.progress.observer(ctx.task_id, observer)
        async with self._executor_sem:
            started = time.perf_counter()
            records = self.call_records
            run = self.engine.open_calls(
                ctx.task_id,
                ctx.code,
                ctx.io,
                calls.function,
                observer=counted,
                record_bytes=0 if records is None else records.record_max_bytes,
            )
            try:
                if not isinstance(calls, CallList):
                    # A streaming Builder's scan feeds the calls as it reads, under
                    # scanSem. One that fails midway fails the task BUILDER_FAILED;
                    # calls of the chunks before may have run.
                    self.progress.count(ctx.task_id)
                    sink: RootSink = self.progress.sink(run)
                    if committer is not None:
                        sink = CommittingSink(sink, run, committer)
                    try:
                        async with self._scan_sem:
                            await feed_calls(calls, sink, self.max_calls)
                    except BundleNotCommitted as exc:
                        return _commit_failed(committer, exc.error)
                    except PluginError as exc:
                        return _builder_failed(exc, committer)
                else:
                    run.add(calls.calls)
                    run.done()
                    self.progress.count(ctx.task_id)
                converged = await run.result()
                self.progress.converged(ctx.task_id, converged)
            finally:
                self.progress.forget(ctx.task_id)  # cancelled: no last counts
        if observer is not None:
            observer.calls_converged(converged, time.perf_counter() - started)
        match converged:
            case CallsConverged():
                self.task_log.calls_converged(ctx.task_id, None)
                runtime.outputs = converged.outputs
                if committer is not None and committer.pending:
                    runtime.outputs = [*committer.pending, *converged.outputs]
                return PhaseSucceeded()
            case CallsFailed():
                self.task_log.calls_converged(ctx.task_id, converged.failed_call)
                if run.records is not None and converged.failed_call is not None:
                    await self._keep_record(runtime, run.records, converged.failed_call)
                return PhaseFailed(
                    failure=converged.failure,
                    call_failures=converged.call_failures,
                    call_failures_omitted=converged.call_failures_omitted,
                    plugin_results=_committed(committer, converged.failure),
                )
            case _:
                assert_never(converged)

    async def _committer(self, runtime: TaskRuntime, config_text: str) -> BundleCommitter | None:
        """The committer of a streamed bundle task's finished bundles; None when its
        writer config is refused (the Writer phase reports it)."""
        assert runtime.ctx is not None
        config = await self.offload.run(
            "writer", len(config_text), decode_checked_config, config_text
        )
        # The Writer Plugin's scope is the only one that may write.
        writer_ctx = dataclasses.replace(runtime.ctx, io=runtime.ctx.io.writer())
        try:
            return BundleCommitter(writer_ctx, config)
        except PluginError:
            return None

    async def _keep_record(
        self, runtime: TaskRuntime, records: RunRecords, failed: CallFailure
    ) -> None:
        """Keep the record of the call that failed the task, encoded off the loop."""
        ctx, store = runtime.ctx, self.call_records
        assert ctx is not None
        assert store is not None
        record = records.record(
            failed.index,
            function=runtime.calls.function if runtime.calls is not None else "",
            snapshot=ctx.code,
            chain=ctx.io.chain or "",
            ending=failure_ending(failed),
        )
        if record is None:
            return
        size = sum(len(s) for s in record.code.values()) + records.kept_bytes(failed.index)
        try:
            document = await self.offload.run("record", size, encode_record, record, indent=0)
        except (TypeError, ValueError, OverflowError) as exc:  # arguments no JSON holds
            log.warning(
                "task %s: the record of call %d is not kept: %s", ctx.task_id, failed.index, exc
            )
            return
        store.keep(ctx.task_id, failed.index, document, self._clock.now_ms())

    async def writer(self, runtime: TaskRuntime, plugin: WriterPlugin | None) -> PhaseOutcome:
        handler = runtime.task.result_handler
        async with self._writer_sem:
            if handler is None or plugin is None:
                return PhaseSucceeded()  # no writer runs; pluginResults is empty
            assert runtime.ctx is not None
            try:
                # The Writer Plugin's scope is the only one that may write.
                writer_ctx = dataclasses.replace(runtime.ctx, io=runtime.ctx.io.writer())
                size = len(handler.config)
                config = await self.offload.run(
                    "writer", size, decode_checked_config, handler.config
                )
                self._writer_started(runtime.task.task_id)
                result = await plugin.execute(writer_ctx, config, runtime.outputs)
            except PluginError as exc:
                return PhaseFailed(
                    failure=Failure.of(
                        FailureCode.PLUGIN_FAILED, exc.message, retryable=exc.retryable
                    ),
                    plugin_results=(
                        failed_writer_result(handler.type, FailureCode.PLUGIN_FAILED, exc.message),
                    ),
                )
        return PhaseSucceeded(
            plugin_results=(PluginResult(plugin_name=handler.type, success=True, result=result),),
        )


def _builder_failed(exc: PluginError, committer: BundleCommitter | None = None) -> PhaseOutcome:
    failure = Failure.of(FailureCode.BUILDER_FAILED, exc.message, retryable=exc.retryable)
    return PhaseFailed(failure=failure, plugin_results=_committed(committer, failure))


def _commit_failed(committer: BundleCommitter | None, exc: PluginError) -> PhaseOutcome:
    failure = Failure.of(FailureCode.PLUGIN_FAILED, exc.message, retryable=exc.retryable)
    return PhaseFailed(failure=failure, plugin_results=_committed(committer, failure))


def _committed(committer: BundleCommitter | None, failure: Failure) -> tuple[PluginResult, ...]:
    """A streamed bundle task's failed plugin result, with the bundles committed
    before it failed; none for any other task."""
    if committer is None:
        return ()
    return (
        PluginResult(
            plugin_name=BlockBundleWriteResultHandler.name,
            success=False,
            failure_code=failure.kind if isinstance(failure.kind, FailureCode) else None,
            failure_message=failure.message,
            result=committer.result(),
        ),
    )


class BundleNotCommitted(Exception):
    """A finished bundle's commit failed during the Calls phase."""

    def __init__(self, error: PluginError) -> None:
        super().__init__(error.message)
        self.error = error


class CommittingSink:
    """A streamed bundle task's feed sink: each time the feeder waits for room, the
    outputs of the calls done so far go to the task's ``BundleCommitter``, which
    commits the bundles they finish (BlockBundleWriteResultHandler's early commits)."""

    __slots__ = ("_committer", "_run", "_sink")

    def __init__(self, sink: RootSink, run: CallRun, committer: BundleCommitter) -> None:
        self._sink = sink
        self._run = run
        self._committer = committer

    @property
    def ended(self) -> bool:
        return self._sink.ended

    async def wait_room(self) -> None:
        """Commit what the calls finished as they finish, until the run has room."""
        run = self._run
        while True:
            try:
                await self._committer.commit(run.take_outputs())
            except PluginError as exc:
                raise BundleNotCommitted(exc) from None
            if run.has_room:
                return
            await run.wait_progress()

    def add(self, roots: Sequence[RootCall]) -> None:
        self._sink.add(roots)
        self._committer.added(len(roots))

    def done(self) -> None:
        self._sink.done()

    def close(self) -> None:
        self._sink.close()
