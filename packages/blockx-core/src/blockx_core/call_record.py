"""A call's record: what it was asked, every IO request it made with its answer, and
how it ended, as one readable JSON document (a fixture).

``blockx invoke --record FILE`` and ``DebugInvoke`` write one; a Worker keeps one
for each root call that fails (its IO up to ``CALL_RECORD_MAX_BYTES``); the
``localtestservice`` backend serves one back, so a replayed call sees exactly the
answers recorded. The IO of a call's sub-calls is part of its record: a replay runs
them too.

``code`` holds the sources of the code epoch the call ran in (module name to
source), ``code_digest`` their content address (``CodeSnapshot.digest``): a replay
loads that code, so an exception is raised at the same line.

Everything here is pure: ``RecordBuilder`` bounds a record as it grows,
``RecordedAnswers`` answers a replayed request from a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from blockx_core.failures import CallFailureKind, IoErrorKind
from blockx_core.io import canonical_arguments

CALL_RECORD_FORMAT: Final = "blockx-call-record/1"
# What a Worker keeps of one call's IO at most (CALL_RECORD_MAX_BYTES).
DEFAULT_CALL_RECORD_MAX_BYTES: Final = 4 * 1024 * 1024


class RecordedError(msgspec.Struct, frozen=True, kw_only=True):
    """An IO request's failure as the function saw it (``IoError.kind``, message)."""

    kind: IoErrorKind
    message: str


class RecordedIo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One request ``io.<backend>.<op>(*args, **kwargs)`` and its answer: ``answer``
    (a JSON value) when ``error`` is None, else the failure."""

    backend: str
    op: str
    args: list[Any]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    answer: Any = None
    error: RecordedError | None = None

    def key(self) -> str:
        return request_key(self.backend, self.op, self.args, self.kwargs)


class RecordedFailure(msgspec.Struct, frozen=True, kw_only=True):
    """How the call failed: the executor's kind and message (type, message and
    traceback of a USER_ERROR)."""

    kind: CallFailureKind
    message: str


class CallRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One call, replayable offline. ``truncated``: the IO buffer filled and the
    later requests are missing (a replay reaching them fails NOT_FOUND)."""

    function: str
    args: list[Any]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    chain: str = ""
    code_epoch: int = 0
    code_digest: str = ""
    code: dict[str, str] = msgspec.field(default_factory=dict)
    io: list[RecordedIo] = msgspec.field(default_factory=list)
    truncated: bool = False
    # Exactly one of these once the call ended; neither while it runs.
    result: Any = None
    failure: RecordedFailure | None = None
    format: str = CALL_RECORD_FORMAT


class InvalidRecord(ValueError):
    """A document that is no call record this version reads."""


def request_key(backend: str, op: str, args: list[Any], kwargs: Mapping[str, Any]) -> str:
    """The same text for the same request (keyword order aside)."""
    return f"{backend}.{op}:{canonical_arguments(args, dict(kwargs))}"


_encoder = msgspec.json.Encoder()


def encode_record(record: CallRecord, *, indent: int = 2) -> bytes:
    """The record as JSON, its format first: indented for people to read and edit (a
    fixture file), or with ``indent=0`` compact on one line (what servers keep and
    send; the same document)."""
    body = _encoder.encode(record)  # answers may be msgspec.Raw: encoded, never converted
    if record.format == CALL_RECORD_FORMAT:  # omitted as the default: put it first
        body = b'{"format":' + _encoder.encode(record.format) + b"," + body[1:]
    if indent <= 0:
        return body
    return msgspec.json.format(body, indent=indent) + b"\n"


def decode_record(data: bytes | str) -> CallRecord:
    """A record read back; InvalidRecord naming what is wrong."""
    try:
        record = msgspec.json.decode(data, type=CallRecord)
    except msgspec.DecodeError as exc:
        raise InvalidRecord(f"not a call record: {exc}") from None
    if record.format != CALL_RECORD_FORMAT:
        raise InvalidRecord(f"call record format {record.format!r} is not {CALL_RECORD_FORMAT!r}")
    return record


class RecordBuilder:
    """Collects one call's IO up to ``max_bytes`` of encoded JSON; past it, requests
    are dropped and the record says ``truncated``."""

    def __init__(self, max_bytes: int = DEFAULT_CALL_RECORD_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.size = 0
        self.truncated = False
        self.io: list[RecordedIo] = []

    def add(self, entry: RecordedIo) -> bool:
        """Keep ``entry`` when it fits; False (and ``truncated``) when it does not."""
        if self.truncated:
            return False
        size = len(_encoder.encode(entry))
        if self.size + size > self.max_bytes:
            self.truncated = True
            return False
        self.size += size
        self.io.append(entry)
        return True


class RecordedAnswers:
    """A record's answers by request: identical requests get their answers in the
    order recorded, the last one again once they run out; a request the record
    does not hold gets None."""

    def __init__(self, io: list[RecordedIo]) -> None:
        self._answers: dict[str, list[RecordedIo]] = {}
        for entry in io:
            self._answers.setdefault(entry.key(), []).append(entry)
        self._served: dict[str, int] = {}

    def answer(
        self, backend: str, op: str, args: list[Any], kwargs: Mapping[str, Any]
    ) -> RecordedIo | None:
        key = request_key(backend, op, args, kwargs)
        answers = self._answers.get(key)
        if not answers:
            return None
        served = self._served.get(key, 0)
        self._served[key] = served + 1
        return answers[min(served, len(answers) - 1)]
