"""The Worker <-> Executor protocol: messages and framing (sans-IO).

One long-lived Unix-socket connection per executor. A frame is a 4-byte
big-endian length followed by a msgpack array of messages; a sender puts every
message that is ready into one frame, and batches of calls travel as columns
(``ExecuteCalls``, ``CallsCompleted``), because per-call overhead decides
throughput. Errors travel inside messages, never as a dropped connection.

msgpack's integers stop at 64 bits; a larger one travels as the extension type
``BIG_INT_EXT`` and is an ``int`` again on the other side, so arguments of any
size reach a function. A message that still cannot be encoded (an object
msgpack has no type for, a string with a lone surrogate) is left out of its
frame alone (``FrameEncoder.encode_sendable``): the sender fails that call, and
the rest of the frame goes out.

Worker -> Executor: LoadCode, ExecuteCalls, ResumeCall, CancelCalls.
Executor -> Worker: Hello (first), ExecutorHeartbeat (periodic), CallsCompleted,
CallFailed, CallOutput (debug calls only), CallTraced (traced calls only),
IoRequested and SubCallRequested (both "CallWaiting": the call is suspended until a
ResumeCall).
"""

from __future__ import annotations

import enum
import struct
from typing import Any, Final, Generic, NamedTuple, TypeVar

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
    # A sub-call's or an IO request's arguments cannot be sent to the Worker.
    BAD_ARGUMENTS = "BAD_ARGUMENTS"


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
    """What a call printed (and, for a debug call, logged) in one run, sent before its
    suspension, completion or failure. ``dropped`` (on the last one of the call) is
    how many bytes of its output went over the executor's bound and were not sent."""

    call_id: int
    text: str
    dropped: int = 0


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


# msgpack's integer range; an int outside it travels as BIG_INT_EXT: its
# two's-complement bytes, big-endian.
BIG_INT_EXT: Final = 1
_MIN_INT: Final = -(2**63)
_MAX_INT: Final = 2**64 - 1
# What msgspec raises for a value it cannot encode.
_UNENCODABLE: Final = (TypeError, ValueError, OverflowError, RecursionError)
# Messages whose only unencodable part can be text for people (a message, an
# error, printed output): sent with the text made encodable rather than dropped.
_TEXT_FIELDS: Final[dict[type[Any], tuple[str, ...]]] = {
    ResumeCall: ("error_kind", "error"),
    CallFailed: ("kind", "message"),
    CallOutput: ("text",),
    CallTraced: ("parent", "failure_kind"),
}


# Values portable() returns as they are, told by their exact type: checked first,
# so the walk of a batch of calls (rows of text, mostly) stays cheap.
_PLAIN: Final = frozenset({str, float, bool, bytes, type(None)})
# A list or a dict longer than this is first tried whole (see portable).
_PROBE_ABOVE: Final = 8
_PROBE: Final = msgspec.msgpack.Encoder()


def _encodes(value: Any) -> bool:
    try:
        _PROBE.encode(value)
    except _UNENCODABLE:
        return False
    return True


def portable(value: Any) -> Any:
    """``value`` with every int beyond msgpack's 64 bits as a ``BIG_INT_EXT``, in
    lists, tuples, dicts and messages at any depth (the rest is left as it is)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is int:
        return value if _MIN_INT <= value <= _MAX_INT else _big_int(value)
    if kind is dict or kind is list or kind is tuple:
        # A long part that encodes as it is (a call's block row, say) is kept whole:
        # msgspec tells so several times faster than a walk in Python. A short one
        # is walked (a failed try costs about as much as its walk).
        if len(value) > _PROBE_ABOVE and _encodes(value):
            return value
        # Plain values and 64-bit ints are told here, without a call.
        if kind is dict:
            return {
                k if type(k) is str else portable(k): v
                if (t := type(v)) in _PLAIN or (t is int and _MIN_INT <= v <= _MAX_INT)
                else portable(v)
                for k, v in value.items()
            }
        return [
            v
            if (t := type(v)) in _PLAIN or (t is int and _MIN_INT <= v <= _MAX_INT)
            else portable(v)
            for v in value
        ]
    if isinstance(value, int):
        if _MIN_INT <= value <= _MAX_INT or isinstance(value, bool):
            return value
        return _big_int(value)
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}
    if isinstance(value, msgspec.Struct):
        fields = value.__struct_fields__
        return msgspec.structs.replace(value, **{f: portable(getattr(value, f)) for f in fields})
    return value


def _big_int(value: int) -> msgspec.msgpack.Ext:
    size = (value.bit_length() + 8) // 8  # room for the sign bit
    return msgspec.msgpack.Ext(BIG_INT_EXT, value.to_bytes(size, "big", signed=True))


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == BIG_INT_EXT:
        return int.from_bytes(data, "big", signed=True)
    return msgspec.msgpack.Ext(code, bytes(data))


def printable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Unsendable(NamedTuple):
    """A message left out of its frame because it cannot be encoded, and why. For a
    batch of calls, the calls left out (an ``ExecuteCalls`` of those only)."""

    message: Any
    reason: str


class FrameEncoder:
    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()

    def encode(self, messages: list[Any]) -> bytes:
        """One frame of ``messages``; raises TypeError, ValueError or RecursionError
        when one of them cannot be encoded."""
        try:
            payload = self._encoder.encode(messages)
        except OverflowError:  # an int beyond 64 bits: the rare case pays for the walk
            payload = self._encoder.encode(portable(messages))
        return _HEADER.pack(len(payload)) + payload

    def encode_sendable(self, messages: list[Any]) -> tuple[bytes, list[Unsendable]]:
        """One frame of the messages that can be encoded (b"" when none can), and
        the ones that cannot. A batch of calls loses only its calls that cannot be
        encoded; a message for people has its text escaped instead."""
        try:
            return self.encode(messages), []
        except _UNENCODABLE:
            pass
        sendable: list[Any] = []
        unsendable: list[Unsendable] = []
        for message in messages:
            reason = self._problem(message)
            if reason is None:
                sendable.append(message)
            elif isinstance(message, ExecuteCalls):
                kept, left_out = self._split(message)
                if kept is not None:
                    sendable.append(kept)
                unsendable += left_out
            elif type(message) in _TEXT_FIELDS:
                texts = {f: printable(getattr(message, f)) for f in _TEXT_FIELDS[type(message)]}
                escaped = msgspec.structs.replace(message, **texts)
                if self._problem(escaped) is None:
                    sendable.append(escaped)
                else:
                    unsendable.append(Unsendable(message, reason))
            else:
                unsendable.append(Unsendable(message, reason))
        return (self.encode(sendable) if sendable else b""), unsendable

    def _problem(self, value: Any) -> str | None:
        """None when ``value`` can be encoded, else what msgspec said."""
        try:
            self._encoder.encode(portable(value))
        except _UNENCODABLE as exc:
            return str(exc) or type(exc).__name__
        return None

    def _split(self, batch: ExecuteCalls) -> tuple[ExecuteCalls | None, list[Unsendable]]:
        """The calls of ``batch`` that can be encoded (None: none), and one
        ``Unsendable`` per call that cannot."""
        n = len(batch.call_ids)
        columns = (batch.args, batch.kwargs, batch.contexts, batch.traces)
        kept: list[int] = []
        left_out: list[Unsendable] = []
        for i in range(n):
            row = [None if column is None else column[i] for column in columns]
            reason = self._problem(row)
            if reason is None:
                kept.append(i)
            else:
                left_out.append(Unsendable(_rows(batch, [i]), reason))
        return (_rows(batch, kept) if kept else None), left_out


def _rows(batch: ExecuteCalls, rows: list[int]) -> ExecuteCalls:
    """The calls at ``rows`` of ``batch`` as a batch of their own."""

    def pick(column: list[Any] | None) -> Any:
        return None if column is None else [column[i] for i in rows]

    return msgspec.structs.replace(
        batch,
        call_ids=pick(batch.call_ids),
        args=pick(batch.args),
        kwargs=pick(batch.kwargs),
        contexts=pick(batch.contexts),
        traces=pick(batch.traces),
    )


M = TypeVar("M")


class FrameDecoder(Generic[M]):
    """Turns a byte stream into lists of messages of type ``M`` (a tagged union)."""

    def __init__(self, message_type: Any) -> None:
        self._decoder: msgspec.msgpack.Decoder[list[M]] = msgspec.msgpack.Decoder(
            list[message_type], ext_hook=_ext_hook
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
