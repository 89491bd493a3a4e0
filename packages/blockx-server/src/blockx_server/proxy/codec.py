"""Codecs that hand grpclib the wire bytes instead of messages.

The proxy never decodes what it forwards: a message (unknown fields included)
and the ``grpc-status-details-bin`` trailer (``blockx_proto.channel``'s
``PASS_THROUGH_DETAILS``) leave exactly as they arrived, and forwarding costs no
protobuf work. Use them on both sides: the proxy's server and every upstream
channel.
"""

from __future__ import annotations

from typing import Any, Final

from grpclib.encoding.base import CodecBase


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


# One instance serves the proxy's server and every upstream channel.
PASS_THROUGH: Final = PassThroughCodec()
