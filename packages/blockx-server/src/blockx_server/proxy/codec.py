"""Codecs that hand grpclib the wire bytes instead of messages.

The proxy never decodes what it forwards: a message (unknown fields included)
and the ``grpc-status-details-bin`` trailer leave exactly as they arrived, and
forwarding costs no protobuf work. Use them on both sides: the proxy's server
and every upstream channel.
"""

from __future__ import annotations

from typing import Any, Final

from grpclib.const import Status
from grpclib.encoding.base import CodecBase, StatusDetailsCodecBase


class PassThroughCodec(CodecBase):
    """Messages are the serialized bytes; ``message_type`` is ignored."""

    # "proto": the content type peers expect (application/grpc[+proto]).
    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, bytes):
            raise TypeError(f"PassThroughCodec sends bytes, not {type(message).__name__}")
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


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


# One instance of each serves the proxy's server and every upstream channel.
PASS_THROUGH: Final = PassThroughCodec()
PASS_THROUGH_DETAILS: Final = PassThroughStatusDetailsCodec()
