"""Spans of sampled calls in the Calls phase, and of their runs in the executors.

A task may make millions of calls, so only the first ``per_task`` calls of each
task are traced (``BLOCKX_TRACE_CALLS_PER_TASK``), every attempt of those calls
included; a run is traced at all only when its phase's span (``parent_of``, else
the current span when the run opens) is recording, i.e. tracing is on and the
task's trace is sampled.

A traced call gets a ``call`` span on the Worker, from its dispatch to its answer
(``blockx.task_id``, ``blockx.call_id``, ``blockx.function``, ``blockx.attempt``,
``blockx.executor_id``, then ``blockx.outcome`` and, when it failed,
``blockx.failure_kind``), with an event per IO request or sub-call it waited on.
Its W3C traceparent goes to the executor in ``ExecuteCalls.traces``; the executor
times the function's run and sends it back (``CallTraced``), and the Worker exports
that as a ``run`` span, child of the ``call`` span, under the executor's own
resource (``service.name=blockx-executor``, its ``process.pid``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from blockx_core.dispatch import KillExecutor, SendCalls
from blockx_core.failures import CallFailureKind
from blockx_executor.protocol import CallTraced
from blockx_server.runtime.tracing import TRACER, export_span, parse_traceparent, traceparent

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan

# Outcomes of a call span that are not a failure kind of the call.
OK: Final = "ok"
CANCELLED: Final = "CANCELLED"
# The longest status description a failed call's span carries.
_MAX_DESCRIPTION: Final = 300
# A failure kind is a FailureKind name; anything longer is not one.
_MAX_KIND: Final = 40


class _RunTrace:
    __slots__ = ("attempts", "context", "remaining")

    def __init__(self, context: Context, remaining: int) -> None:
        self.context = context  # the phase's span, parent of every call span
        self.remaining = remaining  # calls that may still be sampled
        self.attempts: dict[int, int] = {}  # sampled call -> attempts dispatched


class _CallSpan:
    __slots__ = ("executor_id", "span", "task_id")

    def __init__(self, span: Span, executor_id: str, task_id: str) -> None:
        self.span = span
        self.executor_id = executor_id
        self.task_id = task_id


class CallSpans:
    """The call spans of one CallEngine. ``live`` is checked before any per-call
    work, so untraced runs pay one truth test per message."""

    def __init__(
        self,
        per_task: int,
        *,
        tracer: Tracer = TRACER,
        export: Callable[[ReadableSpan], None] = export_span,
        parent_of: Callable[[str], Span] | None = None,
    ) -> None:
        self._per_task = per_task
        # The span of a task's Calls phase; unset: the span current at open_run.
        self._parent_of = parent_of
        self._tracer = tracer
        self._export = export
        self._runs: dict[str, _RunTrace] = {}
        self.live: dict[int, _CallSpan] = {}
        # Traced calls sent and not yet answered with their run's span: call ->
        # (executor, traceparent, task). An executor runs user code, so a span it
        # sends is exported only for the call and the context it was given.
        self._sent: dict[int, tuple[str, str, str]] = {}
        self._resources: dict[str, Resource] = {}

    @property
    def tracing(self) -> bool:
        return bool(self._runs)

    def open_run(self, task_id: str) -> None:
        """The task's Calls phase starts: trace it if its phase's span records."""
        if self._per_task == 0:
            return
        parent = trace.get_current_span() if self._parent_of is None else self._parent_of(task_id)
        if parent.is_recording():
            self._runs[task_id] = _RunTrace(trace.set_span_in_context(parent), self._per_task)

    def close_run(self, task_id: str) -> None:
        """The task's Calls phase ended: its calls still open end unanswered."""
        if self._runs.pop(task_id, None) is None:
            return
        for call_id in [c for c, s in self.live.items() if s.task_id == task_id]:
            self._end(call_id, CANCELLED, "the task's Calls phase ended")
        for call_id in [c for c, sent in self._sent.items() if sent[2] == task_id]:
            del self._sent[call_id]

    def traces(
        self, command: SendCalls, parent_call: Callable[[int], int] = lambda _: 0
    ) -> list[str | None] | None:
        """Start the spans of the sampled calls of ``command``: their traceparents,
        one per call (None: not traced), or None when none of them is traced. A
        sub-call's span is a child of its parent call's, when that one is traced
        (``parent_call``: the parent of a call, 0 for a root)."""
        run = self._runs.get(command.task_id)
        if run is None:
            return None
        out: list[str | None] | None = None
        for index, call_id in enumerate(command.call_ids):
            attempt = run.attempts.get(call_id)
            if attempt is None:
                if run.remaining == 0:
                    continue
                run.remaining -= 1
                attempt = 0
            attempt += 1
            run.attempts[call_id] = attempt
            if call_id in self.live:  # an answer never came: this attempt replaces it
                self._end(call_id, CANCELLED, "sent again")
            parent = self.live.get(parent_call(call_id))
            span = self._tracer.start_span(
                "call",
                context=run.context if parent is None else trace.set_span_in_context(parent.span),
                kind=SpanKind.INTERNAL,
                attributes={
                    "blockx.task_id": command.task_id,
                    "blockx.call_id": call_id,
                    "blockx.function": command.function,
                    "blockx.attempt": attempt,
                    "blockx.executor_id": command.executor_id,
                },
            )
            self.live[call_id] = _CallSpan(span, command.executor_id, command.task_id)
            if out is None:
                out = [None] * len(command.call_ids)
            given = out[index] = traceparent(span.get_span_context())
            self._sent[call_id] = (command.executor_id, given, command.task_id)
        return out

    # ---- answers -----------------------------------------------------------------------

    def completed(self, call_ids: Sequence[int]) -> None:
        live = self.live
        for call_id in call_ids:
            if call_id in live:
                self._end(call_id, OK, None)

    def failed(self, call_id: int, kind: str, message: str) -> None:
        if call_id in self.live:
            self._end(call_id, kind, message)

    def cancelled(self, call_ids: Sequence[int]) -> None:
        for call_id in call_ids:
            if call_id in self.live:
                self._end(call_id, CANCELLED, None)

    def waiting(self, call_id: int, name: str, attributes: dict[str, str]) -> None:
        """The call suspended on an IO request or a sub-call."""
        call = self.live.get(call_id)
        if call is not None:
            call.span.add_event(name, attributes)

    def killed(self, command: KillExecutor) -> None:
        """An executor killed by the watchdog: the call over its budget (if that was
        why) fails BUDGET_EXCEEDED, the others it held EXECUTOR_LOST, as the core
        decided their attempts."""
        if command.over_budget_call_id is not None:
            self.failed(
                command.over_budget_call_id, CallFailureKind.BUDGET_EXCEEDED, command.reason
            )
        self.executor_ended(command.executor_id, CallFailureKind.EXECUTOR_LOST, command.reason)

    def executor_ended(self, executor_id: str, kind: str, reason: str) -> None:
        """Every open span of the calls ``executor_id`` held ends with ``kind``."""
        for call_id in [c for c, s in self.live.items() if s.executor_id == executor_id]:
            self._end(call_id, kind, reason)

    def _end(self, call_id: int, outcome: str, message: str | None) -> None:
        span = self.live.pop(call_id).span
        span.set_attribute("blockx.outcome", outcome)
        if outcome not in (OK, CANCELLED):
            span.set_attribute("blockx.failure_kind", outcome)
            span.set_status(StatusCode.ERROR, _first_line(message or outcome))
        span.end()

    # ---- the executors' spans ----------------------------------------------------------

    def executor_span(self, executor_id: str, pid: int | None, record: CallTraced) -> None:
        """Export the span an executor sent for a traced call's run: only one for a
        call that executor was sent with exactly that trace context, once."""
        sent = self._sent.get(record.call_id)
        if sent is None or sent[:2] != (executor_id, record.parent):
            return
        del self._sent[record.call_id]
        parent = parse_traceparent(record.parent)
        if parent is None:
            return
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, Status

        context = SpanContext(
            parent.trace_id, record.span_id, is_remote=False, trace_flags=parent.trace_flags
        )
        failure_kind = record.failure_kind[:_MAX_KIND]
        failed = bool(failure_kind)
        attributes: dict[str, str | int] = {
            "blockx.call_id": record.call_id,
            "blockx.executor_id": executor_id,
            "blockx.outcome": failure_kind or OK,
        }
        self._export(
            ReadableSpan(
                name="run",
                context=context,
                parent=parent,
                resource=self._resource(executor_id, pid),
                attributes=attributes,
                kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, failure_kind) if failed else Status(),
                start_time=record.start_ns,
                end_time=max(record.end_ns, record.start_ns),
                instrumentation_scope=InstrumentationScope("blockx_executor"),
            )
        )

    def _resource(self, executor_id: str, pid: int | None) -> Resource:
        resource = self._resources.get(executor_id)
        if resource is None:
            from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME, Resource

            attributes: dict[str, str | int] = {
                SERVICE_NAME: "blockx-executor",
                "blockx.executor_id": executor_id,
            }
            if pid is not None:
                attributes[PROCESS_PID] = pid
            resource = self._resources[executor_id] = Resource.create(attributes)
        return resource

    def executor_gone(self, executor_id: str) -> None:
        self._resources.pop(executor_id, None)


def _first_line(message: str) -> str:
    line = message.split("\n", 1)[0]
    return line if len(line) <= _MAX_DESCRIPTION else line[: _MAX_DESCRIPTION - 3] + "..."
