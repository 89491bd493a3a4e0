"""The codec every BlockX server decodes requests with: malformed bytes are the
client's mistake, answered INVALID_ARGUMENT, never an internal error.

grpclib decodes a request inside ``stream.recv_message`` with its codec; an
exception from the parser there reaches the client as ``UNKNOWN: Internal Server
Error`` and is logged with a traceback at ERROR. ``RequestCodec`` checks the
bytes first (``wire_check``) and turns every decoding failure into a GRPCError
naming the message type, which grpclib sends as the status and does not log.
"""

from __future__ import annotations

from typing import Any, Final

import betterproto2
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from blockx_proto._gen.message_pool import default_message_pool
from blockx_server.runtime.wire_check import WireError, check_wire

_TYPE_URL_PREFIX: Final = "type.googleapis.com/"


def message_name(message_type: type) -> str:
    """The protobuf full name of ``message_type`` (``worker.v1.SubmitTaskRequest``)."""
    url = default_message_pool.type_to_url.get(message_type)
    if url is not None:
        return url.removeprefix(_TYPE_URL_PREFIX)
    descriptor = getattr(message_type, "DESCRIPTOR", None)  # a google.protobuf message
    full_name = getattr(descriptor, "full_name", None)
    return full_name if isinstance(full_name, str) else message_type.__name__


def invalid_request(message_type: type, problem: str) -> GRPCError:
    name = message_name(message_type)
    return GRPCError(Status.INVALID_ARGUMENT, f"the request is not a valid {name}: {problem}")


class RequestCodec(ProtoCodec):
    """grpclib's protobuf codec with strict, client-facing decoding."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        if isinstance(message_type, type) and issubclass(message_type, betterproto2.Message):
            try:
                check_wire(data, message_type)
            except WireError as exc:
                raise invalid_request(message_type, str(exc)) from None
        try:
            return super().decode(data, message_type)
        except Exception as exc:  # the parser's own refusal (e.g. google.protobuf's DecodeError)
            raise invalid_request(message_type, str(exc) or type(exc).__name__) from None


REQUEST_CODEC: Final = RequestCodec()
