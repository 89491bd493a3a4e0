"""Request headers grpclib would fail on with an error logged at ERROR.

grpclib's request handler indexes ``:method`` and ``:path`` directly and decodes
every ``-bin`` metadata value as base64 before a handler runs; a request without
them, or with a value that is not base64, raises there, is logged as "Server
error" with a traceback, and the client gets a reset stream. These are a
client's mistakes: a request missing a pseudo-header is reset as an HTTP/2
protocol error, and bad binary metadata is answered INVALID_ARGUMENT, neither
logged.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from typing import Any, Final

from grpclib.const import Status
from grpclib.metadata import decode_bin_value, encode_grpc_message
from grpclib.protocol import Stream as H2Stream
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError

_REQUIRED: Final = (":method", ":path")


def missing_pseudo_header(headers: Sequence[tuple[str, str]]) -> str | None:
    names = {name for name, _ in headers}
    return next((name for name in _REQUIRED if name not in names), None)


def bad_binary_metadata(headers: Sequence[tuple[str, str]]) -> str | None:
    """Why a ``-bin`` value cannot be decoded as grpclib decodes it, or None."""
    for name, value in headers:
        if name.endswith("-bin") and not name.startswith((":", "grpc-")):
            try:
                decode_bin_value(value.encode("ascii"))
            except (binascii.Error, UnicodeEncodeError, ValueError):
                return f"the metadata {name[:64]!r} is not base64, as a -bin value must be"
    return None


async def refuse(stream: H2Stream, release_stream: Callable[[], Any], message: str) -> None:
    """Answer INVALID_ARGUMENT (trailers only) and end the stream."""
    try:
        await stream.send_headers(
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", str(Status.INVALID_ARGUMENT.value)),
                ("grpc-message", encode_grpc_message(message)),
            ],
            end_stream=True,
        )
        if stream.closable:
            stream.reset_nowait()
    except StreamClosedError:
        pass  # the client gave up first
    finally:
        release_stream()


def reset(stream: H2Stream, release_stream: Callable[[], Any]) -> None:
    try:
        if stream.closable:
            stream.reset_nowait(ErrorCodes.PROTOCOL_ERROR)
    finally:
        release_stream()
