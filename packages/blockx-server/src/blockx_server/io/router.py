"""The IO backends of a process, by name, and the one place a request meets one.

A backend declares its read and write operations; the router refuses an
unknown backend or operation, and a write from a scope that may not write,
before the backend sees the request. The router holds what the process's tasks
share: the read cache (answers a backend declares immutable, keyed by the chain and
its epoch) and each backend's adaptive admission.

A process serves chains by name (``ChainIo``): each chain has its own ``blockdb``,
``rpc`` and ``meta`` backends and its own finality view. A request names its
chain (the task's, see ``TaskIoScope``); ``io.router.chain(name).<backend>.<op>``
reaches another chain's backends, read-only. Backends of no chain (``memory``,
``sink``, ``iceberg``) serve every task. It times the backend and encodes its
answer as JSON. Callers do not use it directly: every request goes through a
``TaskIoScope`` (``blockx_server.io.scope``), which adds the task's singleflight,
IO window and retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, assert_never

import msgspec

from blockx_core.chains import DEFAULT_CHAIN
from blockx_core.failures import IoErrorKind
from blockx_core.io import (
    AimdLimit,
    CacheKey,
    ConcurrencyLimit,
    IoRetryPolicy,
    ReadCache,
    canonical_arguments,
)
from blockx_server.io.admission import BackendGate
from blockx_server.io.backends.base import IoBackend
from blockx_server.io.backends.meta import CHAIN_OP, META
from blockx_server.io.errors import BackendError, IoFailed, IoOk, IoOutcome, failure
from blockx_server.io.finality import FinalityView
from blockx_server.io.settings import IoSettings
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from blockx_server.io.chain_io import ChainIo

log = logging.getLogger(__name__)

# What a backend raises for arguments it cannot use (an integer too large for a
# column, say): the function's mistake, answered as BAD_REQUEST.
_BAD_ARGUMENTS: Final = (TypeError, ValueError, ArithmeticError)


class IoObserver(Protocol):
    """What the router reports as it serves (``blockx_server.io.metrics``)."""

    def request_done(self, backend: str, op: str, outcome: IoOutcome) -> None: ...

    def backend_done(self, backend: str, op: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request the router accepted: its backend, and its key in the cache and in a
    task's singleflight table (``cacheable``: the answer may be cached)."""

    backend: IoBackend
    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    write: bool
    key: CacheKey
    cacheable: bool
    # The backend's admission gate (its name, and its chain's when it has one).
    gate: str
    # Whether the answer is encoded as JSON (``IoOk.value_json``); an in-process
    # reader that reads ``IoOk.value`` alone (a Builder's scan) skips the encoding.
    as_json: bool = True


_json = msgspec.json.Encoder()

# Backends a process has only when a setting names their peer.
_ENABLED_BY: Final = {
    "blockdb": "BLOCKDB_URL",
    "blockdb_executor": "BLOCKDB_URL (on PostgreSQL with BLOCKDB_EXECUTOR_URL)",
    "logicalTypes": "BLOCKDB_URL",
    "rpc": "CHAIN_RPC_URL",
    "sink": "SINK_DB_URL",
    "iceberg": "ICEBERG_CATALOG_URI",
}

# What a [chains.NAME] table sets to give its chain a backend.
_CHAIN_KEYS: Final = {
    "blockdb": "blockdb_url",
    "rpc": "rpc_url",
    "blockdb_executor": "blockdb_executor_url",
}

# ``io.router.chain(name).<backend>.<op>(*args)`` travels as this backend and
# operation, its arguments ``[name, backend, op, *args]``.
ROUTER: Final = "router"
ROUTER_CHAIN_OP: Final = "chain"


def gate_name(backend: str, chain: str) -> str:
    """A chain's backend as metrics and admission name it: ``blockdb`` for the
    default chain's (and a chainless backend), ``blockdb@base`` for another's."""
    return backend if chain in ("", DEFAULT_CHAIN) else f"{backend}@{chain}"


class IoRouter:
    def __init__(
        self,
        backends: list[IoBackend] | None = None,
        *,
        settings: IoSettings | None = None,
        finality: FinalityView | None = None,
        limits: Callable[[str], ConcurrencyLimit] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        chains: list[ChainIo] | None = None,
    ) -> None:
        self.settings = settings or IoSettings()
        self.finality = finality
        self.cache = ReadCache(self.settings.cache_max_bytes)
        self.retry_policy = IoRetryPolicy(max_attempts=self.settings.retry_max_attempts)
        self.shared_total = 0
        self._limits = limits or self._adaptive_limit
        self._clock = clock
        self._observer: IoObserver | None = None
        self._backends: dict[str, IoBackend] = {}
        self._gates: dict[str, BackendGate] = {}
        self._chains: dict[str, ChainIo] = {}
        for backend in backends or []:
            self.register(backend)
        for chain_io in chains or []:
            self.add_chain(chain_io)

    def _adaptive_limit(self, backend: str) -> ConcurrencyLimit:
        return AimdLimit(
            min_limit=self.settings.backend_min_concurrency,
            max_limit=self.settings.backend_max_concurrency,
        )

    def register(self, backend: IoBackend) -> None:
        """A backend of no chain."""
        if backend.name in self._backends:
            raise ValueError(f"IO backend {backend.name!r} is registered twice")
        self._backends[backend.name] = backend
        self._add_gate(backend.name)

    def add_chain(self, chain_io: ChainIo) -> None:
        """A chain and its backends."""
        name = chain_io.chain.name
        if name in self._chains:
            raise ValueError(f"chain {name!r} is added twice")
        self._chains[name] = chain_io
        for backend in chain_io.backends.values():
            self._add_gate(gate_name(backend.name, name))

    def _add_gate(self, name: str) -> None:
        self._gates[name] = BackendGate(
            name, self._limits(name), self.settings.queue_timeout_ms, self._clock
        )

    def chains(self) -> list[ChainIo]:
        """The chains served, by name."""
        return [self._chains[name] for name in sorted(self._chains)]

    def chain(self, name: str) -> ChainIo | None:
        return self._chains.get(name)

    def chain_names(self) -> list[str]:
        return sorted(self._chains)

    def served_text(self) -> str:
        """The chains served, for an error message."""
        return ", ".join(self.chain_names()) or "none"

    def observe(self, observer: IoObserver) -> None:
        self._observer = observer

    def backend(self, name: str) -> IoBackend | None:
        return self._backends.get(name)

    def names(self) -> list[str]:
        """Every backend's name, of no chain or of a chain."""
        names = set(self._backends)
        for chain_io in self._chains.values():
            names |= set(chain_io.backends)
        return sorted(names)

    def gates(self) -> list[BackendGate]:
        return [self._gates[name] for name in sorted(self._gates)]

    def prepare(
        self,
        backend_name: str,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        writes: bool,
        chain: str | None = None,
    ) -> Prepared | IoFailed:
        """The accepted request, or why it is refused; ``writes`` says whether the
        caller may write, ``chain`` which chain's backends serve it (None: the only
        chain served, if there is one)."""
        if backend_name == ROUTER:
            return self._prepare_routed(op, args, kwargs)
        if (backend_name, op) == (META, CHAIN_OP) and (args or kwargs):
            # io.meta.chain(name): that chain's meta backend answers.
            named = args[0] if args else kwargs.get("name")
            if isinstance(named, str) and len(args) + len(kwargs) == 1:
                args, kwargs, chain = [], {}, named
        chain_io = None
        if chain is not None:
            chain_io = self._chains.get(chain)
            if chain_io is None:
                return _unknown_chain(chain, self.served_text())
        elif len(self._chains) == 1:
            (chain_io,) = self._chains.values()
        backend = None if chain_io is None else chain_io.backends.get(backend_name)
        if backend is None:
            backend = self._backends.get(backend_name)
            chain_io = None
        if backend is None:
            return self._unknown_backend(backend_name, chain)
        chain_name = "" if chain_io is None else chain_io.chain.name
        return self._prepared(backend, op, args, kwargs, writes, chain_name, chain_io)

    def _unknown_backend(self, backend_name: str, chain: str | None) -> IoFailed:
        names = set(self.names())
        if backend_name in names and chain is None:
            # A chain's backend, asked by a task of no chain while several are served.
            return failure(
                IoErrorKind.UNKNOWN_CHAIN,
                f"io.{backend_name} serves one chain, and this process serves several "
                f"({self.served_text()}): name the task's chain in its Builder config "
                '("chain": NAME) or read io.router.chain(NAME).' + backend_name,
            )
        known = ", ".join(sorted(names | {ROUTER} if self._chains else names)) or "none"
        hint = _ENABLED_BY.get(backend_name)
        setup = f"; set {hint} to enable io.{backend_name}" if hint else ""
        if chain not in (None, DEFAULT_CHAIN) and backend_name in _CHAIN_KEYS:
            setup = f"; give [chains.{chain}] a {_CHAIN_KEYS[backend_name]} to enable it"
        return failure(
            IoErrorKind.UNKNOWN_BACKEND,
            f"no IO backend {backend_name!r} (known: {known}){setup}",
        )

    def _prepare_routed(
        self, op: str, args: list[Any], kwargs: dict[str, Any]
    ) -> Prepared | IoFailed:
        """``io.router.chain(name).<backend>.<op>(*args)``: another chain's backend,
        read-only whoever asks."""
        if op != ROUTER_CHAIN_OP:
            return failure(
                IoErrorKind.UNKNOWN_OP,
                f"io.router has no operation {op!r} (reads: chain(name).<backend>.<op>(...))",
            )
        if len(args) < 3 or not all(isinstance(a, str) for a in args[:3]):
            return failure(
                IoErrorKind.BAD_REQUEST,
                "io.router.chain(name).<backend>.<op>(...) takes a chain name, a backend and "
                "an operation",
            )
        name, backend_name, inner_op = args[0], args[1], args[2]
        chain_io = self._chains.get(name)
        if chain_io is None:
            return _unknown_chain(name, self.served_text())
        backend = chain_io.backends.get(backend_name)
        if backend is None:
            return failure(
                IoErrorKind.UNKNOWN_BACKEND,
                f"chain {name!r} has no IO backend {backend_name!r} "
                f"(it has: {', '.join(sorted(chain_io.backends)) or 'none'})",
            )
        return self._prepared(
            backend, inner_op, list(args[3:]), kwargs, False, chain_io.chain.name, chain_io
        )

    def _prepared(
        self,
        backend: IoBackend,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any],
        writes: bool,
        chain_name: str,
        chain_io: ChainIo | None,
    ) -> Prepared | IoFailed:
        backend_name = backend.name
        write = op in backend.write_ops
        if write:
            if not writes:
                return failure(
                    IoErrorKind.WRITE_FORBIDDEN,
                    f"io.{backend_name}.{op} is a write, and functions are read-only: return "
                    "the data and let the task's Writer Plugin (result handler) write it",
                )
        elif op not in backend.read_ops:
            reads = ", ".join(sorted(backend.read_ops))
            return failure(
                IoErrorKind.UNKNOWN_OP,
                f"io.{backend_name} has no operation {op!r} (reads: {reads})",
            )
        epoch, finalized = self._finality(chain_io)
        # A write is neither cached nor merged: it needs no canonical arguments.
        arguments = "" if write else canonical_arguments(args, kwargs)
        key = CacheKey(backend_name, op, arguments, epoch, chain_name)
        cacheable = False
        if not write and self.cache.max_bytes > 0:
            try:
                cacheable = backend.immutable(op, args, kwargs, finalized)
            except _BAD_ARGUMENTS:
                cacheable = False  # bad arguments: the backend says so when it serves
        gate = gate_name(backend_name, chain_name)
        if gate not in self._gates:
            self._add_gate(gate)  # a backend added to its chain after the chain
        return Prepared(backend, op, args, kwargs, write, key, cacheable, gate)

    def cached(self, prepared: Prepared) -> IoOk | None:
        """The cached answer of an immutable read, or None."""
        if not prepared.cacheable:
            return None
        value = self.cache.get(prepared.key)
        if value is None:
            return None
        return IoOk(value_json=value, cached=True)

    async def serve(self, prepared: Prepared) -> IoOutcome:
        """Admission, then the backend; a successful immutable read is cached.
        ``io_us`` is the backend's time, ``queue_us`` the admission queue's."""
        name = prepared.gate
        gate = self._gates[name]
        queued = time.perf_counter_ns()
        if not await gate.acquire():
            waited = _since_us(queued)
            timed_out = failure(
                IoErrorKind.UNAVAILABLE,
                f"io.{name}.{prepared.op} waited {waited // 1000} ms for the backend's "
                f"admission (IO_QUEUE_TIMEOUT_MS {self.settings.queue_timeout_ms}): "
                "the backend is overloaded",
            )
            return msgspec.structs.replace(timed_out, queue_us=waited)
        queue_us = _since_us(queued)
        started = time.perf_counter_ns()
        try:
            outcome = await self._call(prepared)
        except BaseException:
            # Cancelled, or a backend bug: the room is handed on, nothing is learnt.
            gate.abandon()
            raise
        match outcome:
            case IoOk():
                gate.release(latency_us=outcome.io_us, ok=True)
                if prepared.cacheable:
                    self.cache.put(prepared.key, outcome.value_json, immutable=True)
            case IoFailed():
                # Only an unavailable backend is a sign of overload; a bad request is not.
                overloaded = outcome.kind is IoErrorKind.UNAVAILABLE
                gate.release(latency_us=outcome.io_us, ok=not overloaded)
            case _:
                assert_never(outcome)
        if self._observer is not None:
            self._observer.backend_done(name, prepared.op, (time.perf_counter_ns() - started) / 1e9)
        return msgspec.structs.replace(outcome, queue_us=queue_us)

    async def execute(
        self,
        backend_name: str,
        op: str,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        writes: bool,
        chain: str | None = None,
    ) -> IoOutcome:
        """Serve one request outside any task (no singleflight, window or retry)."""
        prepared = self.prepare(backend_name, op, args, kwargs, writes=writes, chain=chain)
        outcome: IoOutcome
        if isinstance(prepared, IoFailed):
            outcome = prepared
        else:
            outcome = self.cached(prepared) or await self.serve(prepared)
        self.record(backend_name, op, outcome)
        return outcome

    def record(self, backend: str, op: str, outcome: IoOutcome) -> None:
        """One request answered at the door (served, cached, shared or refused)."""
        if outcome.shared:
            self.shared_total += 1
        if self._observer is not None:
            self._observer.request_done(backend, op, outcome)

    def _finality(self, chain_io: ChainIo | None) -> tuple[int, int | None]:
        """The epoch and finalized height of the chain served (of the router's own
        view for a chainless backend); the cache moves to a new epoch as it is seen."""
        view = self.finality if chain_io is None else chain_io.finality
        if view is None:
            return 0, None
        chain = "" if chain_io is None else chain_io.chain.name
        epoch = view.epoch
        if epoch != self.cache.epoch_of(chain):
            self.cache.set_epoch(epoch, chain)
        return epoch, view.finalized

    async def _call(self, prepared: Prepared) -> IoOutcome:
        backend, op, args, kwargs = prepared.backend, prepared.op, prepared.args, prepared.kwargs
        started = time.perf_counter_ns()
        try:
            value = await backend.serve(op, args, kwargs)
        except BackendError as exc:
            return failure(exc.kind, exc.message, _since_us(started), reason=exc.reason)
        except _BAD_ARGUMENTS as exc:
            return failure(
                IoErrorKind.BAD_REQUEST,
                f"io.{backend.name}.{op}{_call_text(args, kwargs)}: {exc}",
                _since_us(started),
            )
        except Exception as exc:
            # A backend's own bug: the call gets an answer (never a wait until its
            # wall limit), the Worker's log the traceback.
            log.exception("io.%s.%s failed inside the backend", backend.name, op)
            return failure(
                IoErrorKind.UNAVAILABLE,
                f"io.{backend.name}.{op} failed inside the backend: {type(exc).__name__}",
                _since_us(started),
            )
        io_us = _since_us(started)
        if not prepared.as_json:
            # Nobody reads the JSON: value_json is left empty, never "null".
            return IoOk(value_json=b"", io_us=io_us, value=value)
        try:
            return IoOk(value_json=_json.encode(value), io_us=io_us, value=value)
        except (TypeError, ValueError) as exc:
            return failure(IoErrorKind.BAD_VALUE, str(exc), io_us)


def _unknown_chain(name: str, served: str) -> IoFailed:
    return failure(IoErrorKind.UNKNOWN_CHAIN, f"no chain {name!r}: this process serves {served}")


def _since_us(started_ns: int) -> int:
    return (time.perf_counter_ns() - started_ns) // 1000


def _call_text(args: list[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"
