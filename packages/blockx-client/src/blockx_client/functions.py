"""``client.function("name")``: call one function through the Sync Invoker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, overload

from blockx_client._convert import (
    args_to_pb,
    debug_invocation_from_pb,
    invocation_from_pb,
    precheck_from_pb,
)
from blockx_client._options import ClientOptions
from blockx_client._typed import as_type
from blockx_client.errors import FunctionError
from blockx_client.models import Invocation, Precheck
from blockx_client.transport import Transport
from blockx_proto import syncinvoker_v1

if TYPE_CHECKING:
    from blockx_client.client import Client

T = TypeVar("T")


class FunctionHandle:
    """Call one function synchronously via the Sync Invoker, outside any task.

    (Inside an executor, ``blockx_executor.call`` is the way: a sub-call of the task.)
    """

    def __init__(self, client: Client, name: str) -> None:
        self._options: ClientOptions = client._options
        self._transport: Transport = client._transport
        self.name = name

    def _stub(self) -> syncinvoker_v1.SyncInvokerServiceStub:
        return syncinvoker_v1.SyncInvokerServiceStub(
            self._transport.channel(self._options.sync_invoker)
        )

    async def invoke(self, *args: Any, timeout_ms: int = 0, call_id: str = "") -> Invocation:
        """Run once; the Invocation says how it went (a failure is not an exception)."""
        reply = await self._transport.unary(
            self._options.sync_invoker,
            self._stub().invoke(
                syncinvoker_v1.InvokeRequest(
                    function=self.name,
                    args=args_to_pb(args),
                    timeout_ms=timeout_ms,
                    call_id=call_id,
                ),
                timeout=self._options.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        return invocation_from_pb(reply)

    @overload
    async def call(self, *args: Any, timeout_ms: int = 0) -> Any: ...
    @overload
    async def call(self, *args: Any, timeout_ms: int = 0, result_type: type[T]) -> T: ...
    async def call(
        self, *args: Any, timeout_ms: int = 0, result_type: type[T] | None = None
    ) -> T | Any:
        """Run once and return the function's value; FunctionError when it fails.

        With ``result_type`` the value is converted to that type (``list[str]``, a
        Struct or dataclass from a JSON object, ...) and typed as such;
        ResultTypeError when it does not fit."""
        result = await self.invoke(*args, timeout_ms=timeout_ms)
        if not result.success:
            raise FunctionError(
                result.failure_code,
                result.failure_message,
                retryable=result.retryable,
                call_id=result.call_id,
            )
        if result_type is None:
            return result.value
        return as_type(result.value, result_type, what=f"the value of {self.name}")

    async def debug(self, *args: Any, timeout_ms: int = 0) -> Invocation:
        """Invoke, plus what the function printed/logged and a trace of its IO."""
        reply = await self._transport.unary(
            self._options.sync_invoker,
            self._stub().debug_invoke(
                syncinvoker_v1.DebugInvokeRequest(
                    function=self.name, args=args_to_pb(args), timeout_ms=timeout_ms
                ),
                timeout=self._options.rpc_timeout_s + timeout_ms / 1000,
            ),
        )
        return debug_invocation_from_pb(reply)

    async def precheck(self, *args: Any, check_args: bool = True) -> Precheck:
        """Compile and check the signature against ``args``, without running it."""
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
