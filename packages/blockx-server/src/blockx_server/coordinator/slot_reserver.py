"""SlotReserver: how the Coordinator asks a Worker for a slot.

``GrpcSlotReserver`` keeps exactly one grpclib channel per worker address (a
point-to-point client needs no balancer) and turns every way a call can end
into a value: ``SlotGranted`` or ``SlotError`` (both from the core).
``SlotError.may_have_allocated`` says whether the request may have reached the
Worker's slot table; what follows from that is the reservation core's decision.
"""

from __future__ import annotations

import logging
import socket
from ssl import SSLContext, SSLError
from typing import Protocol

from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_core.coordinator import SlotAnswer, SlotError
from blockx_core.errors import ErrorCode
from blockx_core.ids import TaskId, WorkerAddr
from blockx_proto import worker_v1
from blockx_proto.channel import Channel, lost_connection
from blockx_server.coordinator.convert import request_task_slot_request, slot_granted_from
from blockx_server.runtime.status import classify_worker_status
from blockx_server.runtime.tracing import trace_calls

log = logging.getLogger(__name__)

_NOT_GRPC_ANSWER = "Missing content-type header"


class SlotReserver(Protocol):
    async def request_task_slot(
        self, worker_addr: WorkerAddr, task_id: TaskId, ttl_ms: int
    ) -> SlotAnswer: ...


class GrpcSlotReserver:
    """RequestTaskSlot over grpclib, one cached channel per worker address."""

    def __init__(self, *, timeout_ms: int, ssl: SSLContext | None = None) -> None:
        self._timeout_s = timeout_ms / 1000
        # GRPC_TLS_*: verify each Worker against the CA, present our certificate.
        self._ssl = ssl
        self._channels: dict[WorkerAddr, Channel] = {}

    async def request_task_slot(
        self, worker_addr: WorkerAddr, task_id: TaskId, ttl_ms: int
    ) -> SlotAnswer:
        try:
            channel = self._channel(worker_addr)
        except InvalidAddress as exc:
            return SlotError(ErrorCode.REJECTED, str(exc), may_have_allocated=False, reached=False)
        stub = worker_v1.WorkerServiceStub(channel)
        request = request_task_slot_request(task_id, ttl_ms)
        try:
            snapshot = await stub.request_task_slot(request, timeout=self._timeout_s)
        except GRPCError as exc:
            if exc.status is Status.UNKNOWN and exc.message == _NOT_GRPC_ANSWER:
                # grpclib's client raises this for a trailers-only answer without a
                # content-type, which is how a grpclib server refuses a method it does
                # not serve: the address is not a Worker, and nothing was allocated.
                return SlotError(
                    ErrorCode.REJECTED,
                    f"{worker_addr} does not serve worker.v1 (answered without content-type)",
                    may_have_allocated=False,
                )
            code, uncertain = classify_worker_status(exc.status)
            return SlotError(code, _describe(exc), may_have_allocated=uncertain)
        except TimeoutError:
            return SlotError(
                ErrorCode.SLOT_UNCERTAIN,
                f"RequestTaskSlot timed out after {self._timeout_s:g} s",
                may_have_allocated=True,
            )
        except (ConnectionRefusedError, socket.gaierror, SSLError) as exc:
            # Only connecting raises these (a TLS handshake, e.g. a certificate our CA
            # did not sign, comes before any request): nothing was sent, so no slot
            # can exist.
            # A definite, non-timeout Unavailable.
            return SlotError(
                ErrorCode.UNAVAILABLE,
                f"cannot connect: {exc}",
                may_have_allocated=False,
                reached=False,
            )
        except (StreamTerminatedError, ProtocolError, OSError) as exc:
            # The connection broke after the request may have been sent: a
            # timeout-type Unavailable in gRPC terms.
            return SlotError(
                ErrorCode.SLOT_UNCERTAIN, f"connection lost: {exc}", may_have_allocated=True
            )
        except AttributeError as exc:
            if not lost_connection(exc):
                raise
            return SlotError(ErrorCode.SLOT_UNCERTAIN, "connection lost", may_have_allocated=True)
        return slot_granted_from(snapshot)

    def _channel(self, worker_addr: WorkerAddr) -> Channel:
        channel = self._channels.get(worker_addr)
        if channel is None:
            host, port = split_host_port(worker_addr)
            channel = trace_calls(Channel(host, port, ssl=self._ssl))
            self._channels[worker_addr] = channel
        return channel

    def forget(self, worker_addr: WorkerAddr) -> None:
        """Close the channel of a worker that left the registry."""
        channel = self._channels.pop(worker_addr, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


def _describe(exc: GRPCError) -> str:
    status = exc.status.name if isinstance(exc.status, Status) else str(exc.status)
    return f"{status}: {exc.message}" if exc.message else status
