"""The API user functions are written against.

A user function is plain Python, ``def`` or ``async def``, called by its name with
the call's positional and keyword arguments. Arguments and return values
are JSON-compatible data. An ``async def`` function reaches data and other
functions through two awaitables::

    from blockx_executor import call, io

    async def balance_report(address):
        balance = await io.memory.get(f"balance:{address}")   # an IO read
        label = await call("format_amount", balance)          # another function
        return {"address": address, "balance": label}

* ``await io.<backend>.<op>(*args, **kwargs)`` sends a read request to the Worker's IO
  backend ``<backend>`` and returns its answer. Functions are read-only: a write
  (``put``, ``delete``, ...) fails the call; writes belong to a Writer Plugin.
  A failed read raises ``IoError`` (``.kind`` says why, ``.retryable`` whether
  asking again may succeed), which you may catch.
* ``await io.router.chain(name).<backend>.<op>(*args, **kwargs)`` reads the same
  way from another chain the cluster serves (``io.blockdb`` and ``io.rpc`` read the
  task's own chain): a cross-chain function. A chain the Worker does not serve
  raises ``IoError`` of kind UNKNOWN_CHAIN naming the chains it serves.
* ``await call(name, *args, **kwargs)`` runs another function as a sub-call (in the
  same task, code epoch and call context) and returns its value; its failure raises
  ``CallError``. ``await function(name).call(*args)`` is the same sub-call through
  a ``FunctionHandle``, the shape blockx_client's ``Client.function(name)`` has.
* ``current_call()`` describes the call being run: its ids and function, and the
  block number and hash when the task's Builder set them. ``in_call()`` says
  whether code runs in a call at all.

While one call awaits, other calls on the same executor run. Only these
awaitables can be awaited, and only by an ``async def`` function the executor
runs: the executor has no event loop, and functions never open connections,
start processes or write files themselves. Awaited anywhere else (a script's own
event loop, a plain ``def``'s ``asyncio.run``) they raise a RuntimeError that
says what to use there.

Outside an executor, a function runs through the Sync Invoker:
``await Client().function(name).call(*args)`` from blockx_client, whose handle
extends ``FunctionHandle`` and makes the sub-call itself when it runs inside a
function. This package depends on nothing else of BlockX, so it stays the whole
API where executors import only the standard library, msgspec and it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from contextvars import ContextVar
from typing import Any, Final

import msgspec

from blockx_executor.no_event_loop import NO_EVENT_LOOP

__all__ = [
    "ApiError",
    "CallError",
    "CallInfo",
    "FunctionHandle",
    "IoError",
    "call",
    "current_call",
    "function",
    "in_call",
    "io",
]


class CallInfo(msgspec.Struct, frozen=True):
    """The call a function body is running as. ``block_number`` and ``block_hash``
    are the chain facts its Builder attached (None when it attached none)."""

    call_id: int
    task_id: str
    function: str
    block_number: int | None = None
    block_hash: str | None = None


_current_call: ContextVar[CallInfo] = ContextVar("blockx_current_call")


def current_call() -> CallInfo:
    """The call being run. Raises RuntimeError outside a BlockX executor."""
    try:
        return _current_call.get()
    except LookupError:
        raise RuntimeError("current_call() is only available inside a BlockX call") from None


def in_call() -> bool:
    """Whether this code runs as part of a BlockX call (a function body, or code it
    calls, in an executor). Code shared with programs outside BlockX asks this to
    choose; it never raises."""
    return _current_call.get(None) is not None


# Why a BlockX awaitable cannot be awaited where it was, by where that is.
_OUTSIDE_A_CALL: Final = (
    "{request} can only be awaited inside a BlockX function, where the executor "
    "answers it; {instead}"
)
_CALL_INSTEAD: Final = (
    "outside one, run the function through the Sync Invoker: await "
    "Client().function({function!r}).call(...) from blockx_client"
)
_IO_INSTEAD: Final = (
    "outside one, run the code that reads as a function: "
    "Client().function(name).call(...) from blockx_client, or blockx invoke"
)
_NOT_SUSPENDABLE: Final = (
    "{request} was awaited on an event loop of the function's own (asyncio.run in a "
    "plain def?): only an async def function can await io.<backend>.<op>(...) and "
    "call(...), because the executor suspends it until the Worker answers"
)


def _check_awaitable_here(request: IoRequest | SubCallRequest) -> None:
    """Raise RuntimeError unless the executor is stepping the coroutine that awaits
    ``request`` (anything else would hand it to a driver that cannot answer it)."""
    if NO_EVENT_LOOP.inside:
        return
    if in_call():
        raise RuntimeError(_NOT_SUSPENDABLE.format(request=request))
    if isinstance(request, SubCallRequest):
        instead = _CALL_INSTEAD.format(function=request.function)
    else:
        instead = _IO_INSTEAD
    raise RuntimeError(_OUTSIDE_A_CALL.format(request=request, instead=instead))


class ApiError(Exception):
    """Base of the errors the API raises into a function; ``kind`` is a stable code,
    ``retryable`` whether the same request may succeed if made again."""

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message
        self.retryable = retryable


class IoError(ApiError):
    """An IO read failed (``kind``: e.g. UNKNOWN_BACKEND, UNKNOWN_OP, BAD_REQUEST, UNAVAILABLE)."""


class CallError(ApiError):
    """A sub-call failed; ``kind`` is its failure kind (USER_ERROR, BUDGET_EXCEEDED, ...)."""


class IoRequest:
    """Awaitable: ``io.<backend>.<op>(*args, **kwargs)``. The executor answers the
    ``yield``."""

    __slots__ = ("args", "backend", "kwargs", "op")

    def __init__(
        self, backend: str, op: str, args: list[Any], kwargs: dict[str, Any] | None = None
    ) -> None:
        self.backend = backend
        self.op = op
        self.args = args
        self.kwargs = kwargs or {}

    def __await__(self) -> Generator[Any, Any, Any]:
        _check_awaitable_here(self)
        return (yield self)

    def __repr__(self) -> str:
        return f"io.{self.backend}.{self.op}({_arguments(self.args, self.kwargs)})"


class ChainIoRequest(IoRequest):
    """Awaitable: ``io.router.chain(name).<backend>.<op>(*args, **kwargs)``, sent as
    the ``router`` backend's ``chain`` operation with ``[name, backend, op, *args]``."""

    __slots__ = ()

    def __repr__(self) -> str:
        chain, backend, op, *rest = self.args
        return f"io.router.chain({chain!r}).{backend}.{op}({_arguments(rest, self.kwargs)})"


class SubCallRequest:
    """Awaitable: ``call(function, *args, **kwargs)``."""

    __slots__ = ("args", "function", "kwargs")

    def __init__(
        self, function: str, args: list[Any], kwargs: dict[str, Any] | None = None
    ) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs or {}

    def __await__(self) -> Generator[Any, Any, Any]:
        _check_awaitable_here(self)
        return (yield self)

    def __repr__(self) -> str:
        arguments = _arguments(self.args, self.kwargs)
        return f"call({self.function!r}{', ' if arguments else ''}{arguments})"


def _arguments(args: list[Any], kwargs: dict[str, Any]) -> str:
    return ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])


class _Backend:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, op: str) -> Callable[..., Awaitable[Any]]:
        if op.startswith("_"):
            raise AttributeError(op)
        backend = self._name

        def request(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            return IoRequest(backend, op, list(args), kwargs)

        request.__name__ = op
        return request

    def __repr__(self) -> str:
        return f"io.{self._name}"


class _ChainBackend:
    __slots__ = ("_backend", "_chain")

    def __init__(self, chain: str, backend: str) -> None:
        self._chain = chain
        self._backend = backend

    def __getattr__(self, op: str) -> Callable[..., Awaitable[Any]]:
        if op.startswith("_"):
            raise AttributeError(op)
        chain, backend = self._chain, self._backend

        def request(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            return ChainIoRequest("router", "chain", [chain, backend, op, *args], kwargs)

        request.__name__ = op
        return request

    def __repr__(self) -> str:
        return f"io.router.chain({self._chain!r}).{self._backend}"


class _ChainIo:
    """``io.router.chain(name)``: another chain's backends, read-only."""

    __slots__ = ("_chain",)

    def __init__(self, chain: str) -> None:
        self._chain = chain

    def __getattr__(self, backend: str) -> _ChainBackend:
        if backend.startswith("_"):
            raise AttributeError(backend)
        return _ChainBackend(self._chain, backend)

    def __repr__(self) -> str:
        return f"io.router.chain({self._chain!r})"


class _Router:
    """``io.router``: ``chain(name)`` reaches the backends of the chain ``name``."""

    __slots__ = ()

    def chain(self, name: str) -> _ChainIo:
        if not isinstance(name, str) or not name:
            raise TypeError(f"io.router.chain(name): name is a chain's name (got {name!r})")
        return _ChainIo(name)

    def __repr__(self) -> str:
        return "io.router"


class _Io:
    """``io.<backend>`` is a backend; ``io.<backend>.<op>(*args, **kwargs)`` an
    awaitable read; ``io.router.chain(name)`` another chain's backends."""

    __slots__ = ()
    router: Final = _Router()

    def __getattr__(self, backend: str) -> _Backend:
        if backend.startswith("_"):
            raise AttributeError(backend)
        return _Backend(backend)

    def __repr__(self) -> str:
        return "io"


io = _Io()


def call(function: str, /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
    """Run ``function(*args, **kwargs)`` as a sub-call and return its value (``await``
    it)."""
    _check_name(function, "call()")
    return SubCallRequest(function, list(args), kwargs)


class FunctionHandle:
    """A function by its name: ``await handle.call(*args)`` runs it and returns its
    value. Here it is a sub-call, as ``call(name, *args)``; blockx_client's
    ``Client.function(name)`` returns a subclass that makes the same sub-call inside
    a BlockX function and goes to the Sync Invoker outside one, so code written
    against this class (say, a helper given a handle) runs in both places."""

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self, *args: Any) -> Awaitable[Any]:
        """Run the function with ``args`` as a sub-call (CallError when it fails)."""
        return SubCallRequest(self.name, list(args))

    def __repr__(self) -> str:
        return f"function({self.name!r})"


def function(name: str) -> FunctionHandle:
    """The function ``name``, to ``await function(name).call(*args)``."""
    _check_name(name, "function()")
    return FunctionHandle(name)


def _check_name(function: object, what: str) -> None:
    if not isinstance(function, str) or not function:
        raise TypeError(f"{what} needs a function name (a non-empty string)")
