"""What an IO request can fail with, and which failures a retry can cure."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from blockx_core.failures import IoErrorKind, is_retryable

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
            return is_retryable(IoErrorKind(self.error_kind))
        except ValueError:
            return False


def failure(kind: IoErrorKind, message: str, io_us: int = 0) -> IoOutcome:
    return IoOutcome(False, error_kind=kind, error=message, io_us=io_us)
