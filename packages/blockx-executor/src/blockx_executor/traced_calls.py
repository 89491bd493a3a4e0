"""Spans of traced calls: when the Worker samples a call for tracing, its
ExecuteCalls entry carries the Worker's call span as a W3C traceparent, and the
executor times the function's run (first entry to its result or failure) as a
child span.

No OpenTelemetry code is imported here: the executor has no network (its own
namespace, the sandbox) and no environment to configure an exporter from, so the
span leaves as a ``CallTraced`` message and the Worker exports it. An untraced call
costs one dictionary check.
"""

from __future__ import annotations

import os
import time

from blockx_executor.protocol import CallTraced

# call_id -> (the traceparent it came with, wall clock when it was first entered)
OpenSpans = dict[int, tuple[str, int]]


def open_span(spans: OpenSpans, call_id: int, parent: str) -> None:
    spans[call_id] = (parent, time.time_ns())


def finished_span(call_id: int, opened: tuple[str, int], failure_kind: str) -> CallTraced:
    # A span id is 8 random bytes, never all zero (the invalid id).
    span_id = int.from_bytes(os.urandom(8), "big") or 1
    return CallTraced(call_id, opened[0], span_id, opened[1], time.time_ns(), failure_kind)
