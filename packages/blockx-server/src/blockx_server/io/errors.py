"""What an IO request can fail with, and which failures a retry can cure."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import msgspec


class IoErrorKind(enum.StrEnum):
    """``IoError.kind`` as a function sees it."""

    UNKNOWN_BACKEND = "UNKNOWN_BACKEND"
    UNKNOWN_OP = "UNKNOWN_OP"
    BAD_REQUEST = "BAD_REQUEST"
    WRITE_FORBIDDEN = "WRITE_FORBIDDEN"
    UNAVAILABLE = "UNAVAILABLE"
    BAD_VALUE = "BAD_VALUE"
    # The backend does not know what was named (a block or transaction a node has not seen).
    NOT_FOUND = "NOT_FOUND"
    # A chain this process does not serve (or none named where several are served).
    UNKNOWN_CHAIN = "UNKNOWN_CHAIN"


# Only a backend that could not answer may answer on a second try; a request that
# names no backend, no operation or bad arguments fails the same way every time.
RETRYABLE: Final[Mapping[IoErrorKind, bool]] = {
    IoErrorKind.UNKNOWN_BACKEND: False,
    IoErrorKind.UNKNOWN_OP: False,
    IoErrorKind.BAD_REQUEST: False,
    IoErrorKind.WRITE_FORBIDDEN: False,
    IoErrorKind.UNAVAILABLE: True,
    IoErrorKind.BAD_VALUE: False,
    IoErrorKind.NOT_FOUND: False,
    IoErrorKind.UNKNOWN_CHAIN: False,
}


_decode: Final = msgspec.json.Decoder().decode


class BackendError(Exception):
    """Raised by a backend; ``kind`` is what the function sees as ``IoError.kind``."""

    def __init__(self, kind: IoErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class IoOutcome(msgspec.Struct, frozen=True):
    """The answer to one IO request: a JSON value, or a failure kind and message.

    ``io_us`` is the time the backend took for this caller, the only part charged to
    the caller's budget: 0 for a cache hit (``cached``) and for a request that shared
    another one in flight (``shared``). ``queue_us`` is the time spent waiting
    instead (the task's IO window, the backend's admission queue, the shared
    request), for traces; it is never charged.
    """

    ok: bool
    value_json: bytes = b"null"
    error_kind: str = ""
    error: str = ""
    io_us: int = 0
    queue_us: int = 0
    cached: bool = False
    shared: bool = False
    # The backend's own answer when it was just served (not cached): what
    # ``value_json`` decodes to, so an in-process caller (a Builder, a Writer) need
    # not decode it again. Shared by every caller of one request: read it, never
    # change it.
    value: Any = msgspec.UNSET

    def decoded(self) -> Any:
        """The answer's value (``value_json`` decoded when it was not kept)."""
        if self.value is msgspec.UNSET:
            return _decode(self.value_json)
        return self.value

    @property
    def write_forbidden(self) -> bool:
        return self.error_kind == IoErrorKind.WRITE_FORBIDDEN

    @property
    def retryable(self) -> bool:
        try:
            return RETRYABLE[IoErrorKind(self.error_kind)]
        except ValueError:
            return False


def failure(kind: IoErrorKind, message: str, io_us: int = 0) -> IoOutcome:
    return IoOutcome(False, error_kind=kind, error=message, io_us=io_us)
