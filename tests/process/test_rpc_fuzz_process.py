"""Every RPC of every BlockX service, fuzzed against the real servers over real sockets.

The methods come from the generated stubs in blockx_proto, so a new RPC is fuzzed
without touching this file (a new service needs a server in SERVERS):

* messages hypothesis builds from each request type's schema, with hostile values
  (extreme ints, empty and long strings, unicode, deep JSON) → OK or a proper
  status, never UNKNOWN or INTERNAL;
* raw request bodies (random bytes) → never UNKNOWN or INTERNAL; and bodies that
  are certainly malformed (a valid message cut short, a varint overflow, a wrong
  wire type, invalid UTF-8) → INVALID_ARGUMENT naming the message type.

Afterwards every server still answers grpc.health.v1, and none logged an ERROR
line or a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import secrets
from collections.abc import Iterator
from typing import Any, Final

import betterproto2
import pytest
from betterproto2 import FieldMetadata, ProtoClassMetadata
from betterproto2.grpclib.grpclib_server import ServiceBase
from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import (
    CallsProcess,
    ConsoleProcess,
    CoordinatorProcess,
    SyncInvokerProcess,
    WorkerProcess,
)

import blockx_proto
from blockx_core.registry import RegistryKind, v2_registry_prefix
from blockx_server.etcd.local import EtcdServer
from blockx_server.proxy.codec import PASS_THROUGH
from blockx_server.runtime.request_codec import message_name

# Hostile strings are large; hypothesis warns when it shows them.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

EXAMPLES: Final = 25  # per method and kind of input: the whole run stays well under a minute
NEVER: Final = (Status.UNKNOWN, Status.INTERNAL)


@dataclasses.dataclass(frozen=True)
class Method:
    path: str
    cardinality: Cardinality
    request_type: type[betterproto2.Message]
    reply_type: type[betterproto2.Message]

    @property
    def package(self) -> str:
        """``worker.v1`` of ``/worker.v1.WorkerService/SubmitTask``."""
        return self.path.split("/")[1].rsplit(".", 1)[0]


def all_methods() -> list[Method]:
    methods = []
    for module_name in blockx_proto.__all__:
        module = getattr(blockx_proto, module_name)
        for name in module.__all__:
            service = getattr(module, name)
            if isinstance(service, type) and issubclass(service, ServiceBase):
                mapping: dict[str, Handler] = service().__mapping__()  # type: ignore[attr-defined]
                for path, handler in mapping.items():
                    methods.append(
                        Method(path, handler.cardinality, handler.request_type, handler.reply_type)
                    )
    return methods


METHODS: Final = all_methods()


@dataclasses.dataclass
class Servers:
    by_package: dict[str, ConsoleProcess]

    def port(self, method: Method) -> int:
        return self.port_of(self.by_package[method.package])

    @staticmethod
    def port_of(server: ConsoleProcess) -> int:
        assert isinstance(server, CallsProcess | CoordinatorProcess)
        return server.port


@pytest.fixture(scope="module")
def servers(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    logs = tmp_path_factory.mktemp("fuzz")
    lane = f"f-{secrets.token_hex(5)}"
    block = v2_registry_prefix("test", lane, RegistryKind.BLOCK)
    bundle = v2_registry_prefix("test", lane, RegistryKind.BUNDLE)
    etcd = {"ETCD_ENDPOINTS": etcd_server.endpoint}
    worker = WorkerProcess(
        {**etcd, "WORKER_REGISTRY_PREFIX": block, "WORKER_HEARTBEAT_INTERVAL": "100"},
        logs / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {**etcd, "COORDINATOR_REGISTRY_PREFIXES": block}, logs / "c.log"
    )
    bundle_coordinator = CoordinatorProcess(
        {**etcd, "COORDINATOR_REGISTRY_PREFIXES": bundle},
        logs / "bundle-c.log",
        program="blockx-bundle-coordinator",
    )
    invoker = SyncInvokerProcess({}, logs / "syncinvoker.log")
    started: list[ConsoleProcess] = [worker, coordinator, bundle_coordinator, invoker]
    try:

        async def ready() -> None:
            await asyncio.gather(
                worker.wait_ready(),
                invoker.wait_ready(),
                coordinator.wait_serving(),
                bundle_coordinator.wait_serving(),
            )

            # The coordinators' helper channels belong to this loop: close them in it.
            for process in (coordinator, bundle_coordinator):
                process.channel.close()
                process._channel = None

        asyncio.run(ready())
        yield Servers(
            {
                "worker.v1": worker,
                "coordinator.v1": coordinator,
                "bundlecoordinator.v1": bundle_coordinator,
                "syncinvoker.v1": invoker,
            }
        )
    finally:
        for process in started:
            process.stop()


# --- messages from the schema ---------------------------------------------------------

HOSTILE_TEXT: Final = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "x" * 70_000,
        "🦀" * 1000,
        "CallListCallConfig",
        "ReturnValueResultHandler",
        "hello_world",
        '["ct2"]',
        "{}",
        '{"function": "hello_world", "callList": [["a"]]}',
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
    ]
)
_INT_RANGES: Final = {
    betterproto2.TYPE_INT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SINT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_UINT32: (0, 2**32 - 1),
    betterproto2.TYPE_FIXED32: (0, 2**32 - 1),
    betterproto2.TYPE_INT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SINT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_UINT64: (0, 2**64 - 1),
    betterproto2.TYPE_FIXED64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted(v for v in {low, high, 0, 1, -1, low + 1, high - 1} if low <= v <= high)
    return st.integers(low, high) | st.sampled_from(edges)


def _field_strategy(
    cls: type[betterproto2.Message], name: str, meta: FieldMetadata, depth: int
) -> Any:
    kind = meta.proto_type
    field_class = schema(cls).cls_by_field.get(name)
    if kind == betterproto2.TYPE_STRING:
        return st.text(max_size=40) | HOSTILE_TEXT
    if kind == betterproto2.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == betterproto2.TYPE_BOOL:
        return st.booleans()
    if kind in (betterproto2.TYPE_FLOAT, betterproto2.TYPE_DOUBLE):
        return st.floats(width=32 if kind == betterproto2.TYPE_FLOAT else 64)
    if kind in _INT_RANGES:
        return _integers(*_INT_RANGES[kind])
    if kind == betterproto2.TYPE_ENUM:
        assert isinstance(field_class, type)
        assert issubclass(field_class, enum.Enum)
        return st.sampled_from(list(field_class)) | _integers(-(2**31), 2**31 - 1).map(field_class)
    if kind == betterproto2.TYPE_MESSAGE:
        assert isinstance(field_class, type)
        assert issubclass(field_class, betterproto2.Message)
        if depth > 4:
            return st.none()
        return st.none() | message_strategy(field_class, depth + 1)
    raise AssertionError(f"no strategy for {kind} fields ({cls.__name__}.{name}): add one")


def schema(cls: type[betterproto2.Message]) -> ProtoClassMetadata:
    # A classproperty whose typing mypy cannot follow on a class object.
    proto: ProtoClassMetadata = cls._betterproto  # type: ignore[arg-type]
    return proto


def message_strategy(cls: type[betterproto2.Message], depth: int = 0) -> st.SearchStrategy[Any]:
    fields = {}
    for name, meta in schema(cls).meta_by_field_name.items():
        strategy = _field_strategy(cls, name, meta, depth)
        fields[name] = st.lists(strategy, max_size=4) if meta.repeated else strategy
    return st.builds(cls, **fields)


# --- calls ---------------------------------------------------------------------------


async def _call(port: int, method: Method, message: Any, *, raw: bool) -> tuple[Status, str]:
    """The status of one call of ``method`` with ``message`` (a message, or raw bytes)."""
    channel = Channel("127.0.0.1", port, codec=PASS_THROUGH) if raw else Channel("127.0.0.1", port)
    try:
        # Raw: the pass-through codec sends and returns the bytes as they are.
        request_type: type[Any] = bytes if raw else method.request_type
        reply_type: type[Any] = bytes if raw else method.reply_type
        stream: ClientStream[Any, Any] = channel.request(
            method.path, method.cardinality, request_type, reply_type, timeout=10
        )
        async with stream:
            await stream.send_message(message, end=True)
            while await stream.recv_message() is not None:
                if not method.cardinality.server_streaming:
                    break
            await stream.recv_trailing_metadata()
        return Status.OK, ""
    except GRPCError as exc:
        return exc.status, exc.message or ""
    except TimeoutError:
        return Status.DEADLINE_EXCEEDED, "the fuzz client's timeout"
    finally:
        channel.close()


def call(
    servers: Servers, method: Method, message: Any, *, raw: bool = False
) -> tuple[Status, str]:
    return asyncio.run(_call(servers.port(method), method, message, raw=raw))


FUZZ_SETTINGS: Final = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_every_service_has_a_server_to_fuzz(servers: Servers) -> None:
    assert {m.package for m in METHODS} <= set(servers.by_package)
    assert {"/worker.v1.WorkerService/SubmitTask", "/syncinvoker.v1.SyncInvokerService/Invoke"} <= {
        m.path for m in METHODS
    }


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.path)
@FUZZ_SETTINGS
@given(data=st.data())
def test_messages_from_the_schema_get_a_proper_status(
    servers: Servers, method: Method, data: st.DataObject
) -> None:
    message = data.draw(message_strategy(method.request_type), label="request")
    status, detail = call(servers, method, message)
    assert status not in NEVER, f"{method.path}: {status.name}: {detail}"


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.path)
@FUZZ_SETTINGS
@given(body=st.binary(max_size=256))
def test_random_bodies_get_a_proper_status(servers: Servers, method: Method, body: bytes) -> None:
    status, detail = call(servers, method, body, raw=True)
    assert status not in NEVER, f"{method.path}: {status.name}: {detail}"


@pytest.mark.parametrize(
    "path",
    ["/syncinvoker.v1.SyncInvokerService/Invoke", "/syncinvoker.v1.SyncInvokerService/DebugInvoke"],
)
def test_a_refusal_quoting_a_huge_field_still_arrives_as_a_status(
    servers: Servers, path: str
) -> None:
    """A chain of 70,000 characters is refused with a status whose message fits in
    the trailer (one quoting it whole made the client drop the connection)."""
    method = next(m for m in METHODS if m.path == path)
    request_type: type[Any] = method.request_type  # InvokeRequest or DebugInvokeRequest
    message = request_type(function="hello_world", args='["a"]', chain="x" * 70_000)
    status, detail = call(servers, method, message)
    assert status == Status.INVALID_ARGUMENT, (status, detail[:200])
    assert "chain must be a chain name" in detail
    assert len(detail) < 4000


# --- bodies that are certainly malformed ----------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


_WIRE_OF: Final = {
    betterproto2.TYPE_STRING: 2,
    betterproto2.TYPE_BYTES: 2,
    betterproto2.TYPE_MESSAGE: 2,
    betterproto2.TYPE_MAP: 2,
    betterproto2.TYPE_DOUBLE: 1,
    betterproto2.TYPE_FIXED64: 1,
    betterproto2.TYPE_SFIXED64: 1,
    betterproto2.TYPE_FLOAT: 5,
    betterproto2.TYPE_FIXED32: 5,
    betterproto2.TYPE_SFIXED32: 5,
}
_PAYLOAD: Final = {0: b"\x01", 1: b"\x00" * 8, 2: b"\x01a", 5: b"\x00" * 4}


def _metas(cls: type[betterproto2.Message]) -> list[FieldMetadata]:
    return list(schema(cls).meta_by_field_name.values())


def malformed_bodies(cls: type[betterproto2.Message]) -> st.SearchStrategy[bytes]:
    metas = _metas(cls)
    strings = [m for m in metas if m.proto_type == betterproto2.TYPE_STRING]
    # A valid message cut by its last byte: its last field is always left incomplete.
    cut = message_strategy(cls).map(bytes).filter(bool).map(lambda body: body[:-1])
    overflow = st.sampled_from(
        [b"\x08" + b"\xff" * 10 + b"\x01", b"\x08" + b"\xff" * 9 + b"\x02", b"\xff" * 11]
    )

    def wrong_wire(meta: FieldMetadata, wire_type: int) -> bytes:
        return _tag(meta.number, wire_type) + _PAYLOAD[wire_type]

    wrong = st.builds(
        wrong_wire,
        st.sampled_from(metas),
        st.sampled_from([0, 1, 2, 5]),
    ).filter(lambda body: not _fits(metas, body))
    strategies = [cut, overflow, wrong]
    if strings:
        bad_utf8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b"])
        strategies.append(
            st.builds(
                lambda meta, text: _tag(meta.number, 2) + _varint(len(text)) + text,
                st.sampled_from(strings),
                bad_utf8,
            )
        )
    return st.one_of(strategies)


def _fits(metas: list[FieldMetadata], body: bytes) -> bool:
    """Whether the single field ``body`` encodes has a wire type its field accepts."""
    number, wire_type = body[0] >> 3, body[0] & 0x7
    meta = next(m for m in metas if m.number == number)
    expected = _WIRE_OF.get(meta.proto_type, 0)
    return wire_type == expected or (wire_type == 2 and bool(meta.repeated) and expected != 2)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.path)
@FUZZ_SETTINGS
@given(data=st.data())
def test_malformed_bodies_are_invalid_argument(
    servers: Servers, method: Method, data: st.DataObject
) -> None:
    body = data.draw(malformed_bodies(method.request_type), label="body")
    status, detail = call(servers, method, body, raw=True)
    assert status is Status.INVALID_ARGUMENT, f"{method.path}: {status.name}: {detail}"
    assert f"is not a valid {message_name(method.request_type)}" in detail


def test_the_servers_still_serve_and_logged_no_error(servers: Servers) -> None:
    async def healthy() -> None:
        for server in servers.by_package.values():
            if isinstance(server, CallsProcess):
                assert await server.health() == HealthCheckResponse.SERVING
            else:  # a Coordinator's health follows its worker view: it answers
                channel = Channel("127.0.0.1", servers.port_of(server))
                try:
                    await HealthStub(channel).Check(HealthCheckRequest(), timeout=10)
                finally:
                    channel.close()

    asyncio.run(healthy())
    for server in servers.by_package.values():
        server.assert_alive()
        output = server.output()
        assert " ERROR " not in output, output
        assert "Traceback" not in output, output
