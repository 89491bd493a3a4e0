"""A grpclib Channel that never gives a call a connection grpclib has closed.

grpclib (0.4) deletes a connection's transport when it closes the connection: at
once when a keepalive ping goes unanswered, and when asyncio reports the
connection lost. A call that reaches such a connection fails inside grpclib with
``AttributeError: 'Connection' object has no attribute '_transport'`` (grpclib
issue #110) instead of a transport error. ``Channel`` closes the two windows a
call can meet it in before sending anything:

* keepalive closed the connection, and the channel still counts it as up until
  asyncio reports the close, an iteration of the loop later: it dials again;
* the connection was lost between being made and the call's turn to use it (a
  peer that accepted and went away): ``ConnectionError``, as for a refused dial,
  since nothing was sent on it.

A connection lost while a call waits to send its request (a full write buffer,
the peer's limit of streams) still fails that call the same way, inside grpclib:
``lost_connection`` recognises it, for the caller to handle like a
``StreamTerminatedError``.

Its error details (the ``grpc-status-details-bin`` trailer, which no BlockX server
sends) are kept as the bytes that came, unless the caller gives a codec: grpclib's
default decodes them with protobuf's ``google.rpc.Status``, whose import costs a
command-line client a twentieth of its start-up.
"""

from __future__ import annotations

from typing import Any, Final

from grpclib.client import Channel as GrpclibChannel
from grpclib.const import Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.protocol import Connection, H2Protocol


class PassThroughStatusDetailsCodec(StatusDetailsCodecBase):
    """Error details are the serialized ``google.rpc.Status`` bytes, kept as they are."""

    def encode(self, status: Status, message: str | None, details: Any) -> bytes:
        if not isinstance(details, bytes):
            raise TypeError(
                f"PassThroughStatusDetailsCodec sends bytes, not {type(details).__name__}"
            )
        return details

    def decode(self, status: Status, message: str | None, data: bytes) -> bytes:
        return data


PASS_THROUGH_DETAILS: Final = PassThroughStatusDetailsCodec()


class Channel(GrpclibChannel):
    """grpclib's Channel, dialling again for a call rather than using a closed
    connection; see the module's text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("status_details_codec") is None:
            kwargs["status_details_codec"] = PASS_THROUGH_DETAILS
        super().__init__(*args, **kwargs)

    @property
    def _connected(self) -> bool:
        protocol = self._protocol
        return bool(super()._connected) and not (
            protocol is not None and protocol.connection.is_closing()
        )

    async def __connect__(self) -> H2Protocol:
        protocol = await super().__connect__()
        if protocol.connection.is_closing():
            raise ConnectionError("the connection closed as soon as it was made")
        return protocol


def lost_connection(exc: AttributeError) -> bool:
    """Whether ``exc`` is grpclib failing a call on a connection it has closed: the
    call was cut off, as a ``StreamTerminatedError`` says."""
    return exc.name == "_transport" and isinstance(exc.obj, Connection)
