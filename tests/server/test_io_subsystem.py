"""The IO subsystem through the one door: the read cache, singleflight, the IO
window, backend admission, retry scopes, metrics, the settings, and a DebugInvoke
trace from a real Sync Invoker."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from prometheus_client import CollectorRegistry
from support import free_port, wait_until

from blockx_core.failures import Failure, FailureCode, IoErrorKind, is_retryable
from blockx_core.io import FixedLimit
from blockx_executor import protocol as wire
from blockx_proto import syncinvoker_v1 as pb
from blockx_server.calls.messages import resume_with_io
from blockx_server.io.errors import BackendError, IoFailed, IoOk, IoOutcome, IoReason, failure
from blockx_server.io.finality import StaticFinality
from blockx_server.io.metrics import IoMetrics
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.io.settings import IoSettings
from blockx_server.pipeline.plugins import PluginError
from blockx_server.syncinvoker.app import serve
from blockx_server.syncinvoker.config import load_syncinvoker_config
from blockx_server.worker.config import BLOCK_WORKER, load_worker_config


class Chain:
    """A scripted chain backend: ``block(n)`` is immutable at or below the finalized
    height; ``head()`` never is. ``gate`` holds every request while it is clear;
    ``fail_next`` UNAVAILABLE answers come first."""

    name = "chain"
    read_ops = frozenset({"block", "head", "bad", "crash"})
    write_ops = frozenset({"put"})

    def __init__(self) -> None:
        self.served: list[tuple[str, list[Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = 0
        self.overflow = False

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return op == "block" and finalized is not None and int(args[0]) <= finalized

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.served.append((op, args))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if self.fail_next:
                self.fail_next -= 1
                raise BackendError(IoErrorKind.UNAVAILABLE, "the node is busy")
            if op == "bad":
                raise ValueError("bad argument")
            if op == "crash":
                raise RuntimeError("a bug in the backend")
            if self.overflow:
                raise OverflowError("Python int too large to convert to SQLite INTEGER")
            return {"op": op, "args": args}
        finally:
            self.in_flight -= 1


@pytest.fixture
def chain() -> Chain:
    return Chain()


@pytest.fixture
def finality() -> StaticFinality:
    return StaticFinality(finalized=10, epoch=0)


@pytest.fixture
def router(chain: Chain, finality: StaticFinality) -> IoRouter:
    return IoRouter([chain], finality=finality)


def served(chain: Chain, op: str = "block") -> int:
    return sum(1 for o, _ in chain.served if o == op)


# -- read cache ----------------------------------------------------------------

CACHE_CASES = [
    # (op, block, backend requests for two reads in a row)
    ("block", 5, 1),  # finalized: the second read is a cache hit
    ("block", 10, 1),  # the finalized block itself
    ("block", 11, 2),  # above the finalized height: never cached
    ("head", 0, 2),  # the head: never cached
]


@pytest.mark.parametrize(("op", "number", "requests"), CACHE_CASES)
async def test_only_immutable_reads_are_served_from_the_cache(
    router: IoRouter, chain: Chain, op: str, number: int, requests: int
) -> None:
    scope = TaskIoScope(router, "t1")
    first = await scope.request("chain", op, [number])
    second = await scope.request("chain", op, [number])
    assert isinstance(first, IoOk)
    assert isinstance(second, IoOk), second
    assert second.value_json == first.value_json
    assert served(chain, op) == requests
    assert second.cached is (requests == 1)


async def test_a_cache_hit_charges_no_backend_time(router: IoRouter) -> None:
    scope = TaskIoScope(router, "t1")
    await scope.request("chain", "block", [1])
    hit = await scope.request("chain", "block", [1])
    assert isinstance(hit, IoOk), hit
    assert hit.cached
    assert hit.io_us == 0
    assert scope.stats.cache_hits == 1


async def test_the_cache_is_shared_by_the_tasks_of_a_process(
    router: IoRouter, chain: Chain
) -> None:
    await TaskIoScope(router, "t1").request("chain", "block", [3])
    hit = await TaskIoScope(router, "t2").request("chain", "block", [3])
    assert isinstance(hit, IoOk), hit
    assert hit.cached
    assert served(chain) == 1


async def test_a_new_epoch_drops_the_cached_reads(
    router: IoRouter, chain: Chain, finality: StaticFinality
) -> None:
    scope = TaskIoScope(router, "t1")
    await scope.request("chain", "block", [3])
    finality.epoch = 1
    again = await scope.request("chain", "block", [3])
    assert isinstance(again, IoOk), again
    assert not again.cached
    assert served(chain) == 2


async def test_without_a_finality_view_or_with_no_cache_nothing_is_cached(chain: Chain) -> None:
    for router in (
        IoRouter([chain]),
        IoRouter([chain], finality=StaticFinality(10), settings=IoSettings(cache_max_bytes=0)),
    ):
        chain.served.clear()
        scope = TaskIoScope(router, "t1")
        await scope.request("chain", "block", [1])
        await scope.request("chain", "block", [1])
        assert served(chain) == 2


async def test_a_read_without_the_cache_neither_fills_nor_uses_it(
    router: IoRouter, chain: Chain
) -> None:
    scope = TaskIoScope(router, "t1")
    first = await scope.request("chain", "block", [2], cache=False)
    second = await scope.request("chain", "block", [2])
    third = await scope.request("chain", "block", [2], cache=False)
    answers = [first, second, third]
    assert all(isinstance(a, IoOk) for a in answers), answers
    assert len({a.value_json for a in answers if isinstance(a, IoOk)}) == 1
    # The first did not fill the cache, the third did not use what the second filled.
    assert [a.cached for a in answers if isinstance(a, IoOk)] == [False, False, False]
    assert served(chain, "block") == 3
    hit = await scope.request("chain", "block", [2])
    assert isinstance(hit, IoOk)
    assert hit.cached


async def test_a_failed_read_is_not_cached(router: IoRouter, chain: Chain) -> None:
    chain.fail_next = 1
    scope = TaskIoScope(router, "t1")
    assert not isinstance(await scope.request("chain", "block", [1]), IoOk)
    assert isinstance(await scope.request("chain", "block", [1]), IoOk)
    assert served(chain) == 2


# -- singleflight --------------------------------------------------------------


async def test_identical_reads_in_flight_in_one_task_share_one_request(
    router: IoRouter, chain: Chain
) -> None:
    chain.gate.clear()
    scope = TaskIoScope(router, "t1")
    reads = [asyncio.create_task(scope.request("chain", "head", [])) for _ in range(100)]
    await wait_until(lambda: chain.in_flight == 1, "the leading read at the backend")
    chain.gate.set()
    outcomes = await asyncio.gather(*reads)
    assert served(chain, "head") == 1
    assert sum(o.shared for o in outcomes) == 99
    assert all(o.io_us == 0 for o in outcomes if o.shared)
    assert all(isinstance(o, IoOk) for o in outcomes)
    assert len({o.value_json for o in outcomes if isinstance(o, IoOk)}) == 1
    assert scope.stats.shared == 99
    assert router.shared_total == 99


async def test_reads_of_different_tasks_do_not_share(router: IoRouter, chain: Chain) -> None:
    chain.gate.clear()
    reads = [
        asyncio.create_task(TaskIoScope(router, task).request("chain", "head", []))
        for task in ("t1", "t2")
    ]
    await wait_until(lambda: chain.in_flight == 2, "both reads at the backend")
    chain.gate.set()
    outcomes = await asyncio.gather(*reads)
    assert not any(o.shared for o in outcomes)


async def test_a_cancelled_leader_does_not_strand_its_followers(
    router: IoRouter, chain: Chain
) -> None:
    chain.gate.clear()
    scope = TaskIoScope(router, "t1")
    leader = asyncio.create_task(scope.request("chain", "head", []))
    await wait_until(lambda: chain.in_flight == 1, "the leader at the backend")
    follower = asyncio.create_task(scope.request("chain", "head", []))
    await asyncio.sleep(0)
    leader.cancel()
    outcome = await asyncio.wait_for(follower, 5)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNAVAILABLE
    assert outcome.retryable


# -- IO window -------------------------------------------------------------------


async def test_the_window_caps_a_tasks_requests_in_flight(chain: Chain) -> None:
    router = IoRouter([chain], settings=IoSettings(task_max_inflight=3))
    chain.gate.clear()
    scope = TaskIoScope(router, "t1")
    reads = [asyncio.create_task(scope.request("chain", "head", [i])) for i in range(10)]
    await wait_until(lambda: chain.in_flight == 3, "three reads at the backend")
    other = asyncio.create_task(TaskIoScope(router, "t2").request("chain", "head", ["x"]))
    await wait_until(lambda: chain.in_flight == 4, "another task's read is not held back")
    chain.gate.set()
    outcomes = await asyncio.gather(*reads, other)
    assert all(isinstance(o, IoOk) for o in outcomes)
    assert chain.max_in_flight == 4
    assert any(o.queue_us > 0 for o in outcomes)


async def test_the_writer_scope_shares_the_tasks_window(chain: Chain) -> None:
    router = IoRouter([chain], settings=IoSettings(task_max_inflight=1))
    chain.gate.clear()
    scope = TaskIoScope(router, "t1")
    read = asyncio.create_task(scope.request("chain", "head", []))
    await wait_until(lambda: chain.in_flight == 1, "the read at the backend")
    write = asyncio.create_task(scope.writer().request("chain", "put", ["k", 1]))
    await asyncio.sleep(0.01)
    assert chain.in_flight == 1
    chain.gate.set()
    assert all(isinstance(o, IoOk) for o in await asyncio.gather(read, write))


# -- admission -------------------------------------------------------------------


async def test_a_request_queued_past_the_timeout_fails_retryable_unavailable(
    chain: Chain,
) -> None:
    router = IoRouter(
        [chain], settings=IoSettings(queue_timeout_ms=50), limits=lambda name: FixedLimit(1)
    )
    chain.gate.clear()
    first = asyncio.create_task(TaskIoScope(router, "t1").request("chain", "head", [1]))
    await wait_until(lambda: chain.in_flight == 1, "the first read at the backend")
    queued = await TaskIoScope(router, "t2").request("chain", "head", [2])
    assert isinstance(queued, IoFailed), queued
    assert queued.kind == IoErrorKind.UNAVAILABLE
    assert queued.retryable
    assert "IO_QUEUE_TIMEOUT_MS" in queued.message
    assert queued.queue_us > 0
    assert queued.io_us == 0
    chain.gate.set()
    assert isinstance(await first, IoOk)
    assert served(chain, "head") == 1


async def test_requests_beyond_the_limit_wait_their_turn(chain: Chain) -> None:
    router = IoRouter([chain], limits=lambda name: FixedLimit(2))
    chain.gate.clear()
    reads = [
        asyncio.create_task(TaskIoScope(router, f"t{i}").request("chain", "head", []))
        for i in range(6)
    ]
    await wait_until(lambda: chain.in_flight == 2, "two reads at the backend")
    (gate,) = router.gates()
    assert gate.queued == 4
    chain.gate.set()
    assert all(isinstance(o, IoOk) for o in await asyncio.gather(*reads))
    assert chain.max_in_flight == 2
    assert gate.in_flight == 0


async def test_a_backend_bug_is_an_answer_and_frees_its_admission_and_window(
    router: IoRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """The call gets an answer (it would otherwise wait until its wall limit), the
    Worker's log the traceback."""
    scope = TaskIoScope(router, "t1")
    outcome = await scope.request("chain", "crash", [])
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNAVAILABLE
    assert outcome.message == "io.chain.crash failed inside the backend: RuntimeError"
    assert "a bug in the backend" in caplog.text
    (gate,) = router.gates()
    assert gate.in_flight == 0
    assert isinstance(await scope.request("chain", "head", []), IoOk)


async def test_an_integer_a_backend_cannot_hold_is_a_bad_request(
    router: IoRouter, chain: Chain
) -> None:
    chain.overflow = True
    outcome = await TaskIoScope(router, "t1").request("chain", "block", [2**200])
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.BAD_REQUEST


# -- retry scopes ----------------------------------------------------------------

RETRY_CASES = [
    # (failures first, max attempts, retry, ok, backend requests)
    (2, 3, True, True, 3),
    (3, 3, True, False, 3),
    (2, 2, True, False, 2),
    (1, 3, False, False, 1),  # a function's read is never retried
]


@pytest.mark.parametrize(("failures", "attempts", "retry", "ok", "requests"), RETRY_CASES)
async def test_builders_and_writers_retry_retryable_failures(
    chain: Chain, failures: int, attempts: int, retry: bool, ok: bool, requests: int
) -> None:
    router = IoRouter([chain], settings=IoSettings(retry_max_attempts=attempts))
    chain.fail_next = failures
    outcome = await TaskIoScope(router, "t1").request("chain", "head", [], retry=retry)
    assert isinstance(outcome, IoOk) is ok
    assert served(chain, "head") == requests


async def test_a_request_that_cannot_succeed_is_not_retried(chain: Chain) -> None:
    router = IoRouter([chain])
    outcome = await TaskIoScope(router, "t1").retrying().request("chain", "bad", [])
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.BAD_REQUEST
    assert served(chain, "bad") == 1


async def test_a_writer_retries_its_writes(chain: Chain) -> None:
    router = IoRouter([chain])
    chain.fail_next = 1
    writer = TaskIoScope(router, "t1").writer().retrying()
    assert isinstance(await writer.request("chain", "put", ["k", 1]), IoOk)
    assert served(chain, "put") == 2


FROM_IO_CASES = [
    (failure(IoErrorKind.UNAVAILABLE, "node down"), True),
    (failure(IoErrorKind.BAD_REQUEST, "no such block"), False),
]


@pytest.mark.parametrize(("outcome", "retryable"), FROM_IO_CASES)
def test_a_plugin_error_takes_retryable_from_the_io_error(
    outcome: IoFailed, retryable: bool
) -> None:
    # One error for Call Builders and Writer Plugins alike.
    error = PluginError.from_io(outcome, "reading block 5")
    assert error.retryable is retryable
    assert error.failure.kind is outcome.kind
    assert outcome.kind in error.message
    assert "reading block 5" in error.message


@pytest.mark.parametrize("kind", list(IoErrorKind))
def test_a_failed_request_is_retryable_as_its_kind_is(kind: IoErrorKind) -> None:
    failed = IoFailed(kind=kind, message="m")
    assert failed.retryable is is_retryable(kind)
    assert failed.failure == Failure(kind, "m", is_retryable(kind))
    assert PluginError.from_io(failed, "a read").retryable is is_retryable(kind)


@pytest.mark.parametrize("retryable", [True, False])
def test_a_plugins_own_failure_is_retryable_as_it_says(retryable: bool) -> None:
    error = PluginError.of("the block is not ingested yet", retryable=retryable)
    assert error.failure == Failure(
        FailureCode.PLUGIN_FAILED, "the block is not ingested yet", retryable
    )
    assert (error.message, error.retryable) == ("the block is not ingested yet", retryable)


RESUME_CASES = [
    # (the answer, what the executor is sent)
    (
        IoOk(value_json=b'{"n":1}', io_us=7, queue_us=3, cached=False),
        wire.ResumeCall(1, True, b'{"n":1}', io_us=7),
    ),
    (IoOk(value_json=b"2", cached=True), wire.ResumeCall(1, True, b"2")),
    (
        IoFailed(kind=IoErrorKind.UNAVAILABLE, message="node down", io_us=5, queue_us=9),
        wire.ResumeCall(1, False, b"null", "UNAVAILABLE", "node down", 5, True),
    ),
    (
        failure(IoErrorKind.BAD_REQUEST, "too wide", reason=IoReason.TOO_MANY_ROWS),
        wire.ResumeCall(1, False, b"null", "BAD_REQUEST", "too wide", 0, False),
    ),
]


@pytest.mark.parametrize(("outcome", "expected"), RESUME_CASES)
def test_an_answer_resumes_its_call_in_the_executors_words(
    outcome: IoOutcome, expected: wire.ResumeCall
) -> None:
    # The executor's wire keeps its strings; a reason stays on the Worker's side.
    assert resume_with_io(1, outcome) == expected


# -- metrics ---------------------------------------------------------------------


async def test_metrics_count_requests_hits_and_show_the_limits(router: IoRouter) -> None:
    registry = CollectorRegistry()
    IoMetrics(registry, router)
    scope = TaskIoScope(router, "t1")
    await scope.request("chain", "block", [1])
    await scope.request("chain", "block", [1])
    await scope.request("chain", "nope", [])

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("blockx_io_requests_total", backend="chain", op="block", outcome="ok") == 2
    assert sample("blockx_io_requests_total", backend="chain", op="nope", outcome="UNKNOWN_OP")
    assert sample("blockx_io_cache_hits_total") == 1
    assert sample("blockx_io_cache_misses_total") == 1
    assert (sample("blockx_io_cache_bytes") or 0) > 0
    assert sample("blockx_io_singleflight_shared_total") == 0
    assert sample("blockx_io_backend_seconds_count", backend="chain", op="block") == 1
    assert (sample("blockx_io_backend_limit", backend="chain") or 0) >= 1
    assert sample("blockx_io_backend_inflight", backend="chain") == 0


# -- settings --------------------------------------------------------------------


def test_io_settings_default_and_follow_call_deadline(tmp_path: Path) -> None:
    base = {"FUNCTIONS_DIR": str(tmp_path), "CALL_DEADLINE_MS": "7000"}
    worker = load_worker_config(BLOCK_WORKER, base)
    assert worker.io == IoSettings(queue_timeout_ms=7000)
    invoker = load_syncinvoker_config(base)
    assert invoker.io == IoSettings(queue_timeout_ms=7000)


def test_io_settings_are_read(tmp_path: Path) -> None:
    env = {
        "FUNCTIONS_DIR": str(tmp_path),
        "IO_CACHE_MAX_BYTES": "0",
        "IO_TASK_MAX_INFLIGHT": "8",
        "IO_BACKEND_MIN_CONCURRENCY": "2",
        "IO_BACKEND_MAX_CONCURRENCY": "16",
        "IO_QUEUE_TIMEOUT_MS": "250",
        "IO_RETRY_MAX_ATTEMPTS": "5",
        "IO_FINALITY_REFRESH_MS": "500",
    }
    assert load_worker_config(BLOCK_WORKER, env).io == IoSettings(
        cache_max_bytes=0,
        task_max_inflight=8,
        backend_min_concurrency=2,
        backend_max_concurrency=16,
        queue_timeout_ms=250,
        retry_max_attempts=5,
        finality_refresh_ms=500,
    )


BAD_SETTINGS = [
    ({"IO_TASK_MAX_INFLIGHT": "0"}, "IO_TASK_MAX_INFLIGHT must be >= 1"),
    ({"IO_QUEUE_TIMEOUT_MS": "soon"}, "IO_QUEUE_TIMEOUT_MS must be an integer"),
    (
        {"IO_BACKEND_MIN_CONCURRENCY": "8", "IO_BACKEND_MAX_CONCURRENCY": "4"},
        "IO_BACKEND_MAX_CONCURRENCY must be >= IO_BACKEND_MIN_CONCURRENCY",
    ),
]


@pytest.mark.parametrize(("env", "message"), BAD_SETTINGS)
def test_bad_io_settings_are_named(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(Exception, match=message):
        load_syncinvoker_config({"FUNCTIONS_DIR": str(tmp_path), **env})


# -- a real Sync Invoker ---------------------------------------------------------

FUNCTIONS = """
from blockx_executor import io

async def rereads(n):
    first = await io.chain.block(n)
    again = await io.chain.block(n)
    head = await io.chain.head()
    return [first, again, head]
"""


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
    return text


class FixedChain(Chain):
    """Every block is final (the Sync Invoker here has no finality view)."""

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return op == "block"


async def test_debug_invoke_traces_cache_hits_and_metrics_count_them(tmp_path: Path) -> None:
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    port, metrics_port = free_port(), free_port()
    config = load_syncinvoker_config(
        {
            "SYNC_INVOKER_LISTEN": f"127.0.0.1:{port}",
            "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"127.0.0.1:{metrics_port}",
            "FUNCTIONS_DIR": str(tmp_path),
            "EXECUTOR_COUNT": "1",
            "EXECUTOR_HEARTBEAT_INTERVAL_MS": "50",
        }
    )
    chain = FixedChain()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, backends=[chain]))
    channel = Channel("127.0.0.1", port)
    stub = pb.SyncInvokerServiceStub(channel)
    try:

        async def serving() -> bool:
            try:
                reply = await stub.invoke(pb.InvokeRequest(function="rereads", args="[7]"))
            except (OSError, GRPCError):
                return False
            return bool(reply.success)

        await wait_until(serving, "the Sync Invoker answering", timeout=30)
        chain.served.clear()
        reply = await stub.debug_invoke(
            pb.DebugInvokeRequest(function="rereads", args="[8]"), timeout=30
        )
        response = reply.response
        assert response is not None
        assert response.success, response.failure_message
        first, again, _ = json.loads(response.result)
        assert first == again
        trace = reply.io_trace
        assert [(t.op, t.cached) for t in trace] == [
            ("block", False),
            ("block", True),
            ("head", False),
        ]
        assert trace[1].duration_us == 0
        assert not any(t.shared for t in trace)
        assert served(chain) == 1
        text = await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics_port}/metrics")
        assert "blockx_io_cache_hits_total" in text
        assert 'blockx_io_backend_limit{backend="chain"}' in text
    finally:
        stop.set()
        channel.close()
        async with asyncio.timeout(30):
            await task
