"""The answer to an IO request: a value (``IoOk``) or a failure (``IoFailed``).

A backend raises ``BackendError`` for a failure a function should see; the router
turns it into ``IoFailed``. Whether trying again may help is the failure kind's,
in ``blockx_core.failures.RETRYABLE``; no code reads the message to decide
anything: a failure that needs telling apart within its kind says so in
``reason``.
"""

from __future__ import annotations

import enum
from typing import Any, Final, TypeAlias

import msgspec

from blockx_core.failures import Failure, IoErrorKind, is_retryable

_decode: Final = msgspec.json.Decoder().decode


class IoReason(enum.Enum):
    """What a failure of a kind means, where a caller acts on more than its kind
    (the function sees only the kind)."""

    # The answer would exceed the backend's row limit (BLOCKDB_MAX_ROWS, a
    # BAD_REQUEST): the same request over a narrower range may succeed.
    TOO_MANY_ROWS = "TOO_MANY_ROWS"


class BackendError(Exception):
    """Raised by a backend; ``kind`` is what the function sees as ``IoError.kind``,
    ``reason`` what only the Worker's own callers act on."""

    def __init__(self, kind: IoErrorKind, message: str, *, reason: IoReason | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.reason = reason


class IoOk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A request's answer: a JSON value.

    ``io_us`` is the time the backend took for this caller, the only part charged to
    the caller's budget: 0 for a cache hit (``cached``) and for a request that shared
    another one in flight (``shared``). ``queue_us`` is the time spent waiting
    instead (the task's IO window, the backend's admission queue, the shared
    request), for traces; it is never charged.
    """

    # Empty for a request made with ``as_json=False`` (TaskIoScope.request): its
    # reader reads ``value``.
    value_json: bytes = b"null"
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


class IoFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A request's failure: its kind (the function's ``IoError.kind``), a message
    for people and, where a caller needs it, a ``reason``.

    ``io_us`` and ``queue_us`` as for ``IoOk``: a backend that failed took time
    too. A failure is never cached; it may be ``shared`` by the requests that
    waited on it.
    """

    kind: IoErrorKind
    message: str
    reason: IoReason | None = None
    io_us: int = 0
    queue_us: int = 0
    shared: bool = False

    @property
    def retryable(self) -> bool:
        return is_retryable(self.kind)

    @property
    def failure(self) -> Failure:
        return Failure.of(self.kind, self.message)


IoOutcome: TypeAlias = IoOk | IoFailed


def failure(
    kind: IoErrorKind, message: str, io_us: int = 0, *, reason: IoReason | None = None
) -> IoFailed:
    return IoFailed(kind=kind, message=message, reason=reason, io_us=io_us)
