"""``client.function("name")``: one function by name, and ``call`` it wherever the
code runs: through the Sync Invoker from a program, as a sub-call of the running
call from inside a BlockX function (as the specification's blockx-py does).

The handle extends ``blockx_executor.FunctionHandle``, the one executors know:
blockx_executor depends on nothing, so inside an executor that runs from the
executor runtime (only the standard library, msgspec and blockx_executor) a
function writes ``blockx_executor.function(name).call(...)``, and a helper given
either handle runs in both places. Whether the code runs in a call is
``blockx_executor.in_call()``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar, overload

import blockx_executor
from blockx_client._convert import (
    args_to_pb,
    debug_invocation_from_pb,
    invocation_from_pb,
    precheck_from_pb,
)
from blockx_client._options import ClientOptions
from blockx_client._typed import as_type
from blockx_client.errors import ChainNotServedError, FunctionError, SlotInvalidError
from blockx_client.models import Invocation, Precheck
from blockx_client.transport import Transport
from blockx_executor import CallError, in_call
from blockx_proto import syncinvoker_v1

T = TypeVar("T")
R = TypeVar("R")


class FunctionHandle(blockx_executor.FunctionHandle):
    """One function by name. ``call`` runs it once and returns its value: through the
    Sync Invoker from a program, as a sub-call (``blockx_executor.call``) when the
    code runs inside a BlockX function. ``invoke``, ``debug`` and ``precheck`` ask
    the Sync Invoker, so they are for programs only."""

    def __init__(self, name: str, *, options: ClientOptions, transport: Transport) -> None:
        """``Client.function`` makes one, with the client's options and channels."""
        super().__init__(name)
        self._options = options
        self._transport = transport

    def _stub(self) -> syncinvoker_v1.SyncInvokerServiceStub:
        return syncinvoker_v1.SyncInvokerServiceStub(
            self._transport.channel(self._options.sync_invoker)
        )

    async def invoke(
        self, *args: Any, timeout_ms: int = 0, call_id: str = "", chain: str | None = None
    ) -> Invocation:
        """Run once; the Invocation says how it went (a failure is not an exception).
        ``chain``: the chain it reads, by its name in the Sync Invoker's
        ``[chains.NAME]`` (None: its only chain); a chain it does not serve is a
        ChainNotServedError naming the chains it serves."""
        self._outside_a_call("invoke")
        reply = await self._ask(
            self._options.sync_invoker,
            self._stub().invoke(
                syncinvoker_v1.InvokeRequest(
                    function=self.name,
                    args=args_to_pb(args),
                    timeout_ms=timeout_ms,
                    call_id=call_id,
                    chain=chain or "",
                ),
                timeout=self._options.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        return invocation_from_pb(reply)

    @overload
    async def call(self, *args: Any, timeout_ms: int = 0, chain: str | None = None) -> Any: ...
    @overload
    async def call(
        self, *args: Any, timeout_ms: int = 0, chain: str | None = None, result_type: type[T]
    ) -> T: ...
    async def call(
        self,
        *args: Any,
        timeout_ms: int = 0,
        chain: str | None = None,
        result_type: type[T] | None = None,
    ) -> T | Any:
        """Run once and return the function's value; FunctionError when it fails.

        Inside a BlockX function this is a sub-call of the running call, in its task
        and code epoch; ``timeout_ms`` does not apply there (a sub-call has its own
        budget, CALL_DEADLINE_MS, within the task's timeout) and neither does
        ``chain`` (a sub-call reads its task's chain; others through
        ``io.router.chain(name)``); outside, ``chain`` is as ``invoke``'s.

        With ``result_type`` the value is converted to that type (``list[str]``, a
        Struct or dataclass from a JSON object, ...) and typed as such;
        ResultTypeError when it does not fit."""
        if in_call():
            if chain is not None:
                raise ValueError(
                    f"function({self.name!r}).call(chain=...) inside a BlockX function: a "
                    "sub-call reads its task's chain (read another through "
                    "io.router.chain(name))"
                )
            value = await self._sub_call(args)
        else:
            result = await self.invoke(*args, timeout_ms=timeout_ms, chain=chain)
            if not result.success:
                raise FunctionError(
                    result.failure_code or "",
                    result.failure_message,
                    retryable=result.retryable,
                    call_id=result.call_id,
                )
            value = result.value
        if result_type is None:
            return value
        return as_type(value, result_type, what=f"the value of {self.name}")

    async def _sub_call(self, args: tuple[Any, ...]) -> Any:
        """The call as a sub-call; its failure is the same FunctionError as outside
        (a sub-call has no call_id of its own to report)."""
        try:
            return await super().call(*args)
        except CallError as exc:
            raise FunctionError(
                exc.kind, exc.message, retryable=exc.retryable, call_id=""
            ) from None

    async def _ask(self, address: str, request: Awaitable[R]) -> R:
        """An Invoke or DebugInvoke: the Sync Invoker's only FAILED_PRECONDITION is a
        chain it does not serve (the status alone would read as a worker's slot)."""
        try:
            return await self._transport.unary(address, request)
        except SlotInvalidError as exc:
            raise ChainNotServedError(exc.message, exc.status) from None

    def _outside_a_call(self, method: str) -> None:
        if in_call():
            raise RuntimeError(
                f"function({self.name!r}).{method}() asks the Sync Invoker, which a "
                "BlockX function cannot reach: use .call(...), a sub-call of the "
                "running call"
            )

    async def debug(self, *args: Any, timeout_ms: int = 0, chain: str | None = None) -> Invocation:
        """Invoke, plus what the function printed/logged and a trace of its IO."""
        self._outside_a_call("debug")
        reply = await self._ask(
            self._options.sync_invoker,
            self._stub().debug_invoke(
                syncinvoker_v1.DebugInvokeRequest(
                    function=self.name,
                    args=args_to_pb(args),
                    timeout_ms=timeout_ms,
                    chain=chain or "",
                ),
                timeout=self._options.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        return debug_invocation_from_pb(reply)

    async def precheck(self, *args: Any, check_args: bool = True) -> Precheck:
        """Compile and check the signature against ``args``, without running it."""
        self._outside_a_call("precheck")
        reply = await self._transport.unary(
            self._options.sync_invoker,
            self._stub().precheck(
                syncinvoker_v1.PrecheckRequest(
                    function=self.name, args=args_to_pb(args) if check_args else ""
                ),
                timeout=self._options.rpc_timeout_s,
            ),
        )
        return precheck_from_pb(reply)
