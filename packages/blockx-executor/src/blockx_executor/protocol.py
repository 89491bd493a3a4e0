"""The Worker <-> Executor protocol: messages and framing (sans-IO).

One long-lived Unix-socket connection per executor. A frame is a 4-byte
big-endian length followed by a msgpack array of messages; a sender puts every
message that is ready into one frame, and batches of calls travel as columns
(``ExecuteCalls``, ``CallsCompleted``), because per-call overhead decides
throughput. Errors travel inside messages, never as a dropped connection.

Worker -> Executor: LoadCode, ExecuteCalls, ResumeCall, CancelCalls.
Executor -> Worker: Hello (first), ExecutorHeartbeat (periodic), CallsCompleted,
CallFailed, CallOutput (debug calls only), CallTraced (traced calls only),
IoRequested and SubCallRequested (both "CallWaiting": the call is suspended until a
ResumeCall).
"""

from __future__ import annotations

import enum
import struct
from typing import Any, Final, Generic, TypeVar

import msgspec

PROTOCOL_VERSION: Final = 1
# A frame larger than this is a bug or an attack, not a batch.
MAX_FRAME_BYTES: Final = 512 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")


class FailureKind(enum.StrEnum):
    """Why an executor failed a call (a subset of blockx_core.dispatch.CallFailureKind)."""

    USER_ERROR = "USER_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    FUNCTION_NOT_FOUND = "FUNCTION_NOT_FOUND"
    BAD_RESULT = "BAD_RESULT"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    # An IoError escaped the function (retried when CALL_RETRY_ON lists it and the
    # IoError was retryable).
    IO_ERROR = "IO_ERROR"


class CallContext(msgspec.Struct, frozen=True, array_like=True):
    """Chain facts the call is about, as its Builder set them (``current_call()``)."""

    block_number: int | None = None
    block_hash: str | None = None


# ---- Worker -> Executor -------------------------------------------------------------


class ImportedSource(msgspec.Struct, frozen=True, array_like=True):
    """A sibling module a loaded module imports, cached by its own ``digest``."""

    digest: str
    source: str


class LoadCode(msgspec.Struct, frozen=True, array_like=True, tag="load"):
    """The source of one module, sent once per digest before the first call to it.

    ``package`` maps each sibling module its imports reach (``import helpers``) to
    that module's source in the same code epoch; None when it imports none."""

    digest: str
    module: str
    source: str
    package: dict[str, ImportedSource] | None = None


class ExecuteCalls(msgspec.Struct, frozen=True, array_like=True, tag="exec"):
    """Calls of one function (in the module with ``digest``), as columns.

    ``kwargs`` and ``contexts`` are None unless some call of the batch has keyword
    arguments or a context, so a plain batch pays nothing per call for them.
    """

    task_id: str
    digest: str
    function: str
    budget_us: int
    call_ids: list[int]
    args: list[list[Any]]
    # Capture what the calls print or log and send it as CallOutput (DebugInvoke).
    debug: bool = False
    kwargs: list[dict[str, Any]] | None = None
    contexts: list[CallContext | None] | None = None
    # The W3C traceparent of each sampled call's span on the Worker (None for the
    # others); None when no call of the batch is traced, so an untraced batch
    # carries one nil and nothing per call.
    traces: list[str | None] | None = None


class ResumeCall(msgspec.Struct, frozen=True, array_like=True, tag="resume"):
    """The answer to a suspended call's IO request or sub-call.

    ``value_json`` is the JSON of the value when ``ok``; otherwise ``error_kind``
    and ``error`` say what failed and ``retryable`` whether asking again may
    succeed (it becomes ``IoError.retryable`` / ``CallError.retryable``). ``io_us``
    is IO backend time charged to the call.
    """

    call_id: int
    ok: bool
    value_json: bytes = b"null"
    error_kind: str = ""
    error: str = ""
    io_us: int = 0
    retryable: bool = False


class CancelCalls(msgspec.Struct, frozen=True, array_like=True, tag="cancel"):
    call_ids: list[int]


# ---- Executor -> Worker -------------------------------------------------------------


class Hello(msgspec.Struct, frozen=True, array_like=True, tag="hello"):
    executor_id: str
    pid: int
    protocol: int = PROTOCOL_VERSION


class ExecutorHeartbeat(msgspec.Struct, frozen=True, array_like=True, tag="hb"):
    """Sent periodically by a thread of the executor. ``running_call`` is the call on
    the CPU right now (0 = none) and ``running_us`` the budget it has consumed so far
    (CPU + IO), current segment included."""

    running_call: int
    running_us: int
    suspended: int
    rss_bytes: int


class CallsCompleted(msgspec.Struct, frozen=True, array_like=True, tag="done"):
    """Successful calls as columns; ``results`` are JSON texts of the return values."""

    call_ids: list[int]
    results: list[bytes]
    cpu_us: list[int]
    io_us: list[int]


class CallFailed(msgspec.Struct, frozen=True, array_like=True, tag="fail"):
    """``retryable`` is False when a retry cannot succeed whatever the kind says: an
    escaped IoError of a kind that fails the same way every time (UNKNOWN_BACKEND,
    BAD_REQUEST, ...)."""

    call_id: int
    kind: str
    message: str
    cpu_us: int = 0
    io_us: int = 0
    retryable: bool = True


class CallTraced(msgspec.Struct, frozen=True, array_like=True, tag="span"):
    """The span of a traced call's run in the executor, sent with its outcome.

    ``parent`` is the traceparent the call came with (the Worker's call span);
    ``span_id`` is the executor's own span; the times are the wall clock
    (``time.time_ns``) when the function was first entered and when its result or
    failure was known (an async call's suspensions included). ``failure_kind`` is
    empty for a call that returned a value. The executor has no network, so the
    Worker exports the span for it.
    """

    call_id: int
    parent: str
    span_id: int
    start_ns: int
    end_ns: int
    failure_kind: str = ""


class CallOutput(msgspec.Struct, frozen=True, array_like=True, tag="out"):
    """What a debug call printed or logged; sent before its completion or failure."""

    call_id: int
    text: str


class IoRequested(msgspec.Struct, frozen=True, array_like=True, tag="io"):
    """CallWaiting: the call awaits ``io.<backend>.<op>(*args, **kwargs)``."""

    call_id: int
    backend: str
    op: str
    args: list[Any]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)


class SubCallRequested(msgspec.Struct, frozen=True, array_like=True, tag="sub"):
    """CallWaiting: the call awaits ``call(function, *args, **kwargs)``."""

    call_id: int
    function: str
    args: list[Any]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)


ToExecutor = LoadCode | ExecuteCalls | ResumeCall | CancelCalls
FromExecutor = (
    Hello
    | ExecutorHeartbeat
    | CallsCompleted
    | CallFailed
    | CallOutput
    | CallTraced
    | IoRequested
    | SubCallRequested
)


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class FrameEncoder:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, messages: list[Any]) -> bytes:
        payload = self._encoder.encode(messages)
        return _HEADER.pack(len(payload)) + payload


M = TypeVar("M")


class FrameDecoder(Generic[M]):
    """Turns a byte stream into lists of messages of type ``M`` (a tagged union)."""

    def __init__(self, message_type: Any) -> None:
        self._decoder: msgspec.msgpack.Decoder[list[M]] = msgspec.msgpack.Decoder(
            list[message_type]
        )
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[M]:
        buffer = self._buffer
        buffer += data
        messages: list[M] = []
        offset = 0
        size = len(buffer)
        while size - offset >= 4:
            (length,) = _HEADER.unpack_from(buffer, offset)
            if length > MAX_FRAME_BYTES:
                raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            end = offset + 4 + length
            if end > size:
                break
            try:
                messages += self._decoder.decode(buffer[offset + 4 : end])
            except msgspec.DecodeError as exc:
                raise ProtocolError(f"undecodable frame: {exc}") from None
            offset = end
        if offset:
            del buffer[:offset]
        return messages

    @property
    def buffered(self) -> int:
        return len(self._buffer)
