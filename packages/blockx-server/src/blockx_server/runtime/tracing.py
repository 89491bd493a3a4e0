"""OpenTelemetry traces: one trace per task, from the Coordinator's ReserveWorkerSlot
through the Worker's RequestTaskSlot and SubmitTask, its phases, to convergence.

The trace context travels in gRPC metadata (W3C ``traceparent`` / ``tracestate``):
every server extracts it from each request (``trace_requests``), and a client
channel made with ``trace_calls`` injects the current one into each request. Spans
are exported over OTLP (HTTP/protobuf) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set,
with the standard ``OTEL_*`` variables; unset, no tracer provider is installed and
every span is a no-op. In the Calls phase the first calls of each task are traced
(``calls/call_spans.py``): their context travels to the executors in the executor
protocol, and the spans the executors send back are exported here
(``export_span``), because an executor has no network of its own.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, TypeVar

from grpclib.client import Channel
from grpclib.events import RecvRequest, SendRequest, listen
from grpclib.server import Server
from opentelemetry import propagate, trace
from opentelemetry.context import Context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

log = logging.getLogger(__name__)

TRACER = trace.get_tracer("blockx")

# The trace context a request arrived with, for its handler (same asyncio task).
_incoming: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "blockx_incoming_trace", default=None
)
# Where spans made elsewhere (the executors') are exported; set with the provider.
_relay: SpanProcessor | None = None


def configure_tracing(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Install an OTLP-exporting tracer provider when OTEL_EXPORTER_OTLP_ENDPOINT
    is set; True when it did."""
    if not environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    global _relay
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    _relay = BatchSpanProcessor(OTLPSpanExporter())
    provider.add_span_processor(_relay)
    trace.set_tracer_provider(provider)
    log.info("exporting traces to %s", environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    return True


def export_span(span: ReadableSpan) -> None:
    """Export a finished span made outside this process's tracer (an executor's),
    with the same exporter; nothing when tracing is off."""
    if _relay is not None:
        _relay.on_end(span)


def traceparent(context: trace.SpanContext) -> str:
    """The W3C ``traceparent`` of ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parse_traceparent(text: str) -> trace.SpanContext | None:
    """The span context of a W3C ``traceparent`` (version 00); None if it is not one."""
    parts = text.split("-")
    if len(parts) != 4 or parts[0] != "00":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))


def incoming_context() -> Context | None:
    """The trace context of the request being handled (None: it carried none)."""
    return _incoming.get()


def trace_requests(server: Server) -> None:
    """Extract every request's trace context for its handler."""

    async def on_request(event: RecvRequest) -> None:
        carrier = _carrier(event.metadata)
        _incoming.set(propagate.extract(carrier) if "traceparent" in carrier else None)

    listen(server, RecvRequest, on_request)


AnyChannel = TypeVar("AnyChannel", bound=Channel)


def trace_calls(channel: AnyChannel) -> AnyChannel:
    """Inject the current trace context into every request on ``channel``."""

    async def on_send(event: SendRequest) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        for key, value in carrier.items():
            event.metadata[key] = value

    listen(channel, SendRequest, on_send)
    return channel


def _carrier(metadata: MutableMapping[str, str | bytes] | object) -> dict[str, str]:
    items = metadata.items() if isinstance(metadata, Mapping) else ()
    return {k: v for k, v in items if isinstance(v, str) and k in ("traceparent", "tracestate")}
