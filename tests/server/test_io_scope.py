"""The IO door: IoRouter, TaskIoScope and the memory backend, and plug-ins by name."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.errors import BackendError, IoFailed, IoOk, IoOutcome
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.plugins import Plugins


class Odd:
    """A backend that fails the ways a real one can."""

    name = "odd"
    read_ops = frozenset({"down", "object", "echo", "wait"})
    write_ops: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.served = 0
        # ``wait`` answers once ``opened`` is set; ``arrived`` is set at its second.
        self.arrived = asyncio.Event()
        self.opened = asyncio.Event()

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return False

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.served += 1
        if op == "down":
            raise BackendError(IoErrorKind.UNAVAILABLE, "the node is not answering")
        if op == "object":
            return object()
        if op == "wait":
            if self.served == 2:
                self.arrived.set()
            await self.opened.wait()
            return [{"block_number": n, "value": str(10**30 + n)} for n in range(args[0])]
        return {"args": args, "kwargs": kwargs}


@pytest.fixture
def memory() -> MemoryBackend:
    return MemoryBackend({"a": 1, "n:1": 10, "n:2": 20})


@pytest.fixture
def odd() -> Odd:
    return Odd()


@pytest.fixture
def router(memory: MemoryBackend, odd: Odd) -> IoRouter:
    return IoRouter([memory, odd])


def value(outcome: IoOutcome) -> Any:
    assert isinstance(outcome, IoOk), outcome
    return json.loads(outcome.value_json)


READS = [
    # (op, args, kwargs, expected)
    ("get", ["a"], {}, 1),
    ("get", ["missing", 7], {}, 7),
    ("get", [], {"key": "missing", "default": 8}, 8),
    ("get", ["missing"], {"default": 9}, 9),
    ("mget", [["a", "missing"]], {}, [1, None]),
    ("has", ["a"], {}, True),
    ("keys", ["n:"], {}, ["n:1", "n:2"]),
    ("keys", [], {"prefix": "n:"}, ["n:1", "n:2"]),
    ("keys", [], {}, ["a", "n:1", "n:2"]),
]


@pytest.mark.parametrize(("op", "args", "kwargs", "expected"), READS)
async def test_reads_with_positional_and_keyword_arguments(
    router: IoRouter, op: str, args: list[Any], kwargs: dict[str, Any], expected: Any
) -> None:
    scope = TaskIoScope(router, "t1")
    assert value(await scope.request("memory", op, args, kwargs)) == expected


@pytest.mark.parametrize(("op", "args", "kwargs", "expected"), READS)
async def test_an_answer_decodes_to_its_json(
    router: IoRouter, op: str, args: list[Any], kwargs: dict[str, Any], expected: Any
) -> None:
    # A served answer keeps the backend's value (no decoding for in-process callers);
    # either way it is what value_json decodes to.
    outcome = await TaskIoScope(router, "t1").request("memory", op, args, kwargs)
    assert isinstance(outcome, IoOk), outcome
    assert outcome.decoded() == expected == value(outcome)
    assert msgspec.structs.replace(outcome, value=msgspec.UNSET).decoded() == expected


FAILURES = [
    # (backend, op, args, kwargs, kind, retryable)
    ("nope", "get", ["a"], {}, IoErrorKind.UNKNOWN_BACKEND, False),
    ("memory", "scan", [], {}, IoErrorKind.UNKNOWN_OP, False),
    ("memory", "get", [], {}, IoErrorKind.BAD_REQUEST, False),
    ("memory", "get", ["a"], {"key": "a"}, IoErrorKind.BAD_REQUEST, False),
    ("memory", "get", ["a"], {"colour": "red"}, IoErrorKind.BAD_REQUEST, False),
    ("memory", "get", [3], {}, IoErrorKind.BAD_REQUEST, False),
    ("memory", "put", ["a", 2], {}, IoErrorKind.WRITE_FORBIDDEN, False),
    ("odd", "object", [], {}, IoErrorKind.BAD_VALUE, False),
    ("odd", "down", [], {}, IoErrorKind.UNAVAILABLE, True),
]


@pytest.mark.parametrize(("backend", "op", "args", "kwargs", "kind", "retryable"), FAILURES)
async def test_failures_have_a_kind_and_say_whether_a_retry_can_help(
    router: IoRouter,
    backend: str,
    op: str,
    args: list[Any],
    kwargs: dict[str, Any],
    kind: IoErrorKind,
    retryable: bool,
) -> None:
    outcome = await TaskIoScope(router, "t1").request(backend, op, args, kwargs)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == kind
    assert outcome.retryable is retryable
    assert outcome.message


async def test_a_refused_write_never_reaches_the_backend(
    router: IoRouter, memory: MemoryBackend
) -> None:
    outcome = await TaskIoScope(router, "t1").request("memory", "delete", ["a"])
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind is IoErrorKind.WRITE_FORBIDDEN
    assert "read-only" in outcome.message
    assert value(await TaskIoScope(router, "t1").request("memory", "get", ["a"])) == 1


async def test_the_writer_scope_writes_and_counts_into_the_task(router: IoRouter) -> None:
    scope = TaskIoScope(router, "t1")
    writer = scope.writer()
    assert writer.writes
    assert not scope.writes
    assert value(await writer.request("memory", "put", ["b"], {"value": {"x": 1}})) is None
    assert value(await writer.request("memory", "mput", [{"c": 3, "d": 4}])) is None
    assert value(await writer.request("memory", "delete", ["d"])) is True
    assert value(await scope.request("memory", "mget", [["b", "c", "d"]])) == [{"x": 1}, 3, None]
    assert scope.stats is writer.stats
    assert scope.stats.requests == 4
    assert scope.stats.failures == 0


async def test_stats_count_requests_failures_and_bytes(router: IoRouter) -> None:
    scope = TaskIoScope(router, "t1")
    ok = await scope.request("memory", "get", ["n:1"])
    await scope.request("memory", "put", ["n:1", 0])
    await scope.request("nope", "get", [])
    assert (scope.stats.requests, scope.stats.failures) == (3, 2)
    assert isinstance(ok, IoOk), ok
    assert scope.stats.bytes == len(ok.value_json) == 2
    assert scope.stats.backend_us >= 0


async def test_a_closed_scope_refuses_and_its_writer_closes_with_it(
    router: IoRouter, odd: Odd
) -> None:
    scope = TaskIoScope(router, "t1")
    writer = scope.writer()
    scope.close()
    for s in (scope, writer):
        outcome = await s.request("odd", "echo", [1])
        assert isinstance(outcome, IoFailed), outcome
        assert outcome.kind == IoErrorKind.UNAVAILABLE
        assert "closed" in outcome.message
    assert odd.served == 0


async def test_keyword_arguments_reach_the_backend(router: IoRouter) -> None:
    outcome = await TaskIoScope(router, "t1").request("odd", "echo", [100], {"to_block": 200})
    assert value(outcome) == {"args": [100], "kwargs": {"to_block": 200}}


def test_a_backend_name_is_registered_once(memory: MemoryBackend) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        IoRouter([memory, MemoryBackend()])


def test_plugins_answer_aliases_and_name_what_is_missing() -> None:
    plugins: Plugins[int] = Plugins("Writer Plugin")
    plugins.register("ReturnValueResultHandler", 1, aliases=["ReturnValueHandler"])
    plugins.register("Other", 2)
    assert plugins.get("ReturnValueHandler") == 1
    assert plugins.get("Other") == 2
    assert plugins.get("Nope") is None
    assert plugins.names() == ["Other", "ReturnValueResultHandler"]
    assert plugins.missing("Nope") == (
        "no Writer Plugin 'Nope' on this worker (known: Other, ReturnValueResultHandler)"
    )
    with pytest.raises(ValueError, match="registered twice"):
        plugins.register("ReturnValueHandler", 3)


@pytest.mark.parametrize(("op", "args", "kwargs", "expected"), READS)
async def test_a_value_only_read_answers_the_same_value_without_its_json(
    router: IoRouter, op: str, args: list[Any], kwargs: dict[str, Any], expected: Any
) -> None:
    scope = TaskIoScope(router, "t1")
    encoded = await scope.request("memory", op, args, kwargs)
    kept = await scope.request("memory", op, args, kwargs, as_json=False)
    assert isinstance(kept, IoOk), kept
    assert kept.value_json == b""  # never "null": a reader of the JSON fails loudly
    assert kept.decoded() == value(encoded) == expected
    # Only the JSON answer's bytes are counted.
    assert isinstance(encoded, IoOk)
    assert scope.stats.bytes == len(encoded.value_json)


async def test_a_value_only_read_shares_no_request_in_flight(router: IoRouter, odd: Odd) -> None:
    """A JSON reader never gets a value-only answer (no JSON) by sharing its request,
    nor the other way round: each is served on its own."""
    scope = TaskIoScope(router, "t1")
    first = asyncio.ensure_future(scope.request("odd", "wait", [3]))
    shared = asyncio.ensure_future(scope.request("odd", "wait", [3]))
    kept = asyncio.ensure_future(scope.request("odd", "wait", [3], as_json=False))
    await odd.arrived.wait()
    odd.opened.set()
    outcomes = await asyncio.gather(first, shared, kept)
    assert odd.served == 2  # the two JSON reads share one request
    assert [o.shared for o in outcomes] == [False, True, False]
    rows = [{"block_number": n, "value": str(10**30 + n)} for n in range(3)]
    assert value(outcomes[0]) == value(outcomes[1]) == rows
    assert isinstance(outcomes[2], IoOk)
    assert outcomes[2].value_json == b""
    assert outcomes[2].decoded() == rows
