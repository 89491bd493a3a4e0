"""A task's lifecycle on this Worker, as log events (``runtime/logs.py``) and trace
spans (``runtime/tracing.py``).

Every event carries ``event``, ``task_id``, ``worker`` (the advertised address),
``function`` and ``code_epoch``; the last two are null until known (the epoch is
pinned at activation, the function is named by the Builder). The events, in the
order a task meets them: ``reserved`` (RequestTaskSlot granted a slot),
``submitted`` (SubmitTask accepted), ``phase_started`` / ``phase_finished`` for each
of ``BUILDER``, ``CALLS`` and ``WRITER``, ``converged`` (the terminal state and
failure code), ``purged`` (the retained result's retention ended); a reserved slot
nobody submitted to ends in ``slot_expired``. ``cancel_asked`` is a CancelTask that
found the task (its ``outcome``: CANCELLED, FINISHED or WRITING).

``submitted``, ``converged``, ``cancel_asked`` and ``slot_expired`` are INFO (a failed task's
``converged`` WARNING); ``reserved``, the phase events and ``purged`` are DEBUG (a
busy Worker runs thousands of tasks a second), a failed phase WARNING.

Spans: a ``task`` span from SubmitTask accepted to convergence, with one child span
per phase (``BUILDER``, ``CALLS``, ``WRITER``). Its parent is the trace context
SubmitTask carried, else the one the task's RequestTaskSlot carried (the
Coordinator's ReserveWorkerSlot), so one trace runs from the reservation to the end.
"""

from __future__ import annotations

import logging
from typing import Final, assert_never

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode

from blockx_core.dispatch import CallFailure
from blockx_core.failures import FailureKind
from blockx_core.task import TaskInput, TaskState
from blockx_core.worker import (
    CancelOutcome,
    PhaseCrashed,
    PhaseFailed,
    PhaseOutcome,
    PhaseSucceeded,
    TaskConverged,
    TaskPhase,
    TaskSnapshot,
)
from blockx_server.runtime.logs import log_event
from blockx_server.runtime.tracing import TRACER, incoming_context

log = logging.getLogger("blockx.task")


class _Known:
    __slots__ = ("code_epoch", "failed_call", "function", "phase_span", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.phase_span: Span | None = None
        self.function: str | None = None
        self.code_epoch: int | None = None
        # The root call that failed the Calls phase, told before the phase ends.
        self.failed_call: CallFailure | None = None


class TaskLog:
    """Logs the lifecycle events; keeps the function and epoch of the running tasks."""

    def __init__(self, worker: str) -> None:
        self._worker = worker
        self._running: dict[str, _Known] = {}
        # The trace context of each reserved slot's RequestTaskSlot, until SubmitTask.
        self._reserved_in: dict[str, Context] = {}

    def reserved(self, slot: TaskSnapshot) -> None:
        """RequestTaskSlot answered ``slot`` (a task that ran already answers its state)."""
        if slot.state is not TaskState.ALLOCATED:
            return
        context = incoming_context()
        if context is not None:
            self._reserved_in[slot.task_id] = context
        self._event(
            "reserved",
            slot.task_id,
            None,
            logging.DEBUG,
            slot_id=slot.slot_id,
            lease_deadline_ms=slot.lease_deadline_ms,
        )

    def submitted(self, task: TaskInput) -> None:
        reserved_in = self._reserved_in.pop(task.task_id, None)
        span = TRACER.start_span(
            "task",
            context=incoming_context() or reserved_in,
            kind=SpanKind.SERVER,
            attributes={"blockx.task_id": task.task_id, "blockx.worker": self._worker},
        )
        known = self._running[task.task_id] = _Known(span)
        handler = task.result_handler
        self._event(
            "submitted",
            task.task_id,
            known,
            builder=task.function_call_config.type,
            writer=None if handler is None else handler.type,
            task_timeout_ms=task.task_timeout_ms,
        )

    def activated(self, task_id: str, code_epoch: int) -> None:
        known = self._running.get(task_id)
        if known is not None:
            known.code_epoch = code_epoch
            known.span.set_attribute("blockx.code_epoch", code_epoch)

    def function_known(self, task_id: str, function: str) -> None:
        known = self._running.get(task_id)
        if known is not None:
            known.function = function
            known.span.set_attribute("blockx.function", function)

    def calls_converged(self, task_id: str, failed_call: CallFailure | None) -> None:
        known = self._running.get(task_id)
        if known is not None:
            known.failed_call = failed_call

    def phase_started(self, task_id: str, phase: TaskPhase) -> None:
        known = self._running.get(task_id)
        if known is not None:
            parent = trace.set_span_in_context(known.span)
            known.phase_span = TRACER.start_span(phase.value, context=parent)
        self._event("phase_started", task_id, known, logging.DEBUG, phase=phase.value)

    def phase_span(self, task_id: str) -> Span:
        """The span of the task's running phase (a non-recording one when there is
        none): the Calls phase's call spans are its children."""
        known = self._running.get(task_id)
        if known is None or known.phase_span is None:
            return trace.INVALID_SPAN
        return known.phase_span

    def phase_finished(
        self,
        task_id: str,
        phase: TaskPhase,
        outcome: PhaseOutcome,
        seconds: float,
    ) -> None:
        known = self._running.get(task_id)
        failed_call = None
        if known is not None and phase is TaskPhase.CALLS:
            failed_call, known.failed_call = known.failed_call, None
        code: FailureKind | None = None
        call_count: int | None = None
        match outcome:
            case PhaseSucceeded():
                call_count = outcome.call_count
            case PhaseFailed():
                code = outcome.failure.kind
            case PhaseCrashed():
                pass  # the core gives it the phase's own code
            case _:
                assert_never(outcome)
        success = isinstance(outcome, PhaseSucceeded)
        fields: dict[str, object] = {
            "phase": phase.value,
            "success": success,
            "failure_code": None if code is None else code.value,
            "duration_ms": round(seconds * 1000, 3),
        }
        if call_count is not None:
            fields["call_count"] = call_count
        if failed_call is not None:
            # The root call that failed the task: its index in the Builder's list.
            fields["call_index"] = failed_call.index
            fields["call_failure_kind"] = failed_call.kind.value
            fields["call_attempts"] = failed_call.attempts
        if known is not None and known.phase_span is not None:
            _end(known.phase_span, success, code.value if code else None)
            known.phase_span = None
        level = logging.DEBUG if success else logging.WARNING
        self._event("phase_finished", task_id, known, level, **fields)

    def converged(self, command: TaskConverged, seconds: float | None) -> None:
        known = self._running.pop(command.task_id, None)
        result = command.result
        code = result.failure_code
        if known is not None:
            if known.phase_span is not None:  # converged mid-phase (a timeout, a lost watch)
                _end(known.phase_span, False, code.value if code else None)
            known.span.set_attribute("blockx.state", command.state.value)
            _end(known.span, result.success, code.value if code else None)
        self._event(
            "converged",
            command.task_id,
            known,
            logging.INFO if result.success else logging.WARNING,
            slot_id=command.slot_id,
            state=command.state.value,
            success=result.success,
            failure_code=None if code is None else code.value,
            retryable=result.retryable,
            failure_message=_first_line(result.failure_message),
            duration_ms=None if seconds is None else round(seconds * 1000, 3),
        )

    def cancel_asked(self, task_id: str, outcome: CancelOutcome) -> None:
        """A CancelTask found the task (``outcome``: what it did); one that cancelled
        it is followed by its ``converged``."""
        known = self._running.get(task_id)
        self._event("cancel_asked", task_id, known, outcome=outcome.value)

    def slot_expired(self, task_id: str, slot_id: str) -> None:
        self._reserved_in.pop(task_id, None)
        self._event("slot_expired", task_id, None, slot_id=slot_id)

    def purged(self, task_id: str) -> None:
        self._event("purged", task_id, None, logging.DEBUG)

    def _event(
        self,
        event: str,
        task_id: str,
        known: _Known | None,
        level: int = logging.INFO,
        **fields: object,
    ) -> None:
        if not log.isEnabledFor(level):
            return
        message = f"task {task_id} {event}"
        phase = fields.get("phase")
        if phase is not None:
            message += f" {phase}"
        log_event(
            log,
            message,
            {
                "event": event,
                "task_id": task_id,
                "worker": self._worker,
                "function": None if known is None else known.function,
                "code_epoch": None if known is None else known.code_epoch,
                **fields,
            },
            level,
        )


def _end(span: Span, success: bool, failure_code: str | None) -> None:
    if not success:
        span.set_status(StatusCode.ERROR, failure_code or "failed")
        if failure_code:
            span.set_attribute("blockx.failure_code", failure_code)
    span.end()


# The longest failure line an event carries: the whole message (a traceback, a
# budget text) stays in the task's result.
MAX_FAILURE_LINE: Final = 300


def _first_line(message: str) -> str | None:
    line = message.split("\n", 1)[0]
    if len(line) > MAX_FAILURE_LINE:
        line = line[: MAX_FAILURE_LINE - 3] + "..."
    return line or None
