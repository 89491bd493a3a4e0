"""Traces across real processes: a client span (the SDK's in-memory exporter) →
the Coordinator's ReserveWorkerSlot → the Worker's task and its phases → the
sampled calls' spans → their runs in the executor processes, one trace id,
exported over OTLP/HTTP to a receiver the test runs."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from processes import CoordinatorProcess, WorkerProcess
from support import wait_until

from blockx_proto import coordinator_v1, worker_v1
from blockx_server.etcd.local import EtcdServer
from blockx_server.runtime.tracing import trace_calls

# Each received span's resource attributes, by the span object's id.
_RESOURCES: dict[int, dict[str, Any]] = {}


class _Receiver(BaseHTTPRequestHandler):
    spans: ClassVar[list[tuple[str, Any]]] = []  # (service.name, span); set per receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            )
            resource = {a.key: a.value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    _RESOURCES[id(span)] = resource
                    self.spans.append((service, span))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    spans: list[tuple[str, Any]] = []
    handler = type("Receiver", (_Receiver,), {"spans": spans})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", spans
    server.shutdown()
    server.server_close()


def executor_spans(exported: list[tuple[str, Any]]) -> list[tuple[Any, dict[str, Any]]]:
    """The spans exported under an executor's resource, with that resource."""
    return [
        (span, resource)
        for service, span in exported
        if service == "blockx-executor"
        for resource in [_RESOURCES[id(span)]]
    ]


@pytest.fixture
def client_spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


async def test_one_trace_runs_from_the_client_through_reserve_to_the_phases(
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    tmp_path: Path,
    otlp_receiver: tuple[str, list[tuple[str, Any]]],
    client_spans: InMemorySpanExporter,
) -> None:
    endpoint, exported = otlp_receiver
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    lane = unique_lane()
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": lane,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            # Three calls, two traced: the first two dispatched.
            "BLOCKX_TRACE_CALLS_PER_TASK": "2",
            **otel,
        },
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd_server.endpoint, "COORDINATOR_REGISTRY_PREFIXES": lane, **otel},
        tmp_path / "coordinator.log",
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(client_spans))
    tracer = provider.get_tracer("test-client")
    try:
        await worker.wait_ready()
        await coordinator.wait_serving()

        async def routed() -> bool:
            return await coordinator.status_of("probe") is Status.OK

        await wait_until(routed, "the coordinator routing to the worker", timeout=20)
        channel = trace_calls(Channel(coordinator.host, coordinator.port))
        try:
            with tracer.start_as_current_span("client submit"):
                reservation = await coordinator_v1.CoordinatorServiceStub(
                    channel
                ).reserve_worker_slot(
                    coordinator_v1.ReserveWorkerSlotRequest(task_id="tr-1"), timeout=10
                )
        finally:
            channel.close()
        worker_channel = worker.channel()
        try:
            stub = worker_v1.WorkerServiceStub(worker_channel)
            # SubmitTask carries no trace context: the task joins the reservation's trace.
            await stub.submit_task(
                worker_v1.SubmitTaskRequest(
                    task=worker_v1.TaskInput(
                        task_id="tr-1",
                        function_call_config=worker_v1.FunctionCallConfig(
                            type="CallListCallConfig",
                            config=json.dumps(
                                {"function": "hello_world", "callList": [["t"], ["u"], ["v"]]}
                            ),
                        ),
                        result_handler=worker_v1.ResultHandler(
                            type="ReturnValueResultHandler", config="{}"
                        ),
                    ),
                    slot_id=reservation.slot_id,
                )
            )
            async with asyncio.timeout(30):
                updates = [
                    u
                    async for u in stub.watch_tasks(worker_v1.WatchTasksRequest(task_ids=["tr-1"]))
                ]
            assert updates[-1].state is worker_v1.TaskState.SUCCEEDED
        finally:
            worker_channel.close()
    finally:
        assert worker.stop() == 0  # the exporter flushes at exit
        assert coordinator.stop() == 0
        provider.shutdown()

    (client,) = client_spans.get_finished_spans()
    trace_id = client.context.trace_id

    def named(service: str, name: str) -> list[Any]:
        return [
            span
            for s, span in exported
            if s == service
            and span.name == name
            and int.from_bytes(span.trace_id, "big") == trace_id
        ]

    (reserve,) = named("blockx-coordinator", "ReserveWorkerSlot")
    assert int.from_bytes(reserve.parent_span_id, "big") == client.context.span_id
    (task,) = named("blockx-worker", "task")
    assert task.parent_span_id == reserve.span_id
    attributes = {a.key: a.value for a in task.attributes}
    assert attributes["blockx.task_id"].string_value == "tr-1"
    assert attributes["blockx.function"].string_value == "hello_world"
    assert attributes["blockx.code_epoch"].int_value == 1
    assert attributes["blockx.state"].string_value == "SUCCEEDED"
    for phase in ("BUILDER", "CALLS", "WRITER"):
        (span,) = named("blockx-worker", phase)
        assert span.parent_span_id == task.span_id
    (calls_phase,) = named("blockx-worker", "CALLS")
    calls = named("blockx-worker", "call")
    assert len(calls) == 2
    call_attributes = []
    for span in calls:
        assert span.parent_span_id == calls_phase.span_id
        a = {x.key: x.value for x in span.attributes}
        assert a["blockx.task_id"].string_value == "tr-1"
        assert a["blockx.function"].string_value == "hello_world"
        assert a["blockx.attempt"].int_value == 1
        assert a["blockx.outcome"].string_value == "ok"
        call_attributes.append(a["blockx.call_id"].int_value)
    assert len(set(call_attributes)) == 2
    # The runs, timed in the executor processes, children of the Worker's call spans.
    runs = [
        (span, resource)
        for span, resource in executor_spans(exported)
        if int.from_bytes(span.trace_id, "big") == trace_id
    ]
    assert sorted(span.parent_span_id for span, _ in runs) == sorted(c.span_id for c in calls)
    for span, resource in runs:
        assert span.name == "run"
        assert resource["process.pid"].int_value not in (0, worker.proc.pid)
        (call,) = [c for c in calls if c.span_id == span.parent_span_id]
        assert call.start_time_unix_nano <= span.start_time_unix_nano
        assert span.start_time_unix_nano <= span.end_time_unix_nano
    assert trace.get_tracer_provider() is not provider  # the test's own, never global
