"""Logging of every BlockX server program: text for people, JSON lines for machines.

``BLOCKX_LOG_FORMAT=json`` writes one JSON object per line on stderr: ``ts`` (UTC,
RFC 3339 with milliseconds), ``level``, ``logger``, ``message``, then the event's
own fields. ``text`` (the default) is one line a person reads at a terminal, the
event's fields appended as ``key=value``. Events with fields are logged through
``log_event`` (the task lifecycle of ``worker/task_log.py``); any other log call
keeps working and carries only the four fixed keys.

HTTP/2 framing and header compression (the ``h2``, ``hpack`` loggers) log every
frame at DEBUG; they stay at INFO, even with ``BLOCKX_LOG_LEVEL=DEBUG``, unless
``BLOCKX_LOG_WIRE=1`` asks for them.
"""

from __future__ import annotations

import enum
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Final, TextIO

import msgspec

from blockx_server.runtime.env import ConfigReader, Environ, EnvironSource
from blockx_server.runtime.settings import InvalidValue, Setting, flag


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def log_format(raw: str) -> LogFormat:
    try:
        return LogFormat(raw.lower())
    except ValueError:
        choices = " or ".join(f.value for f in LogFormat)
        raise InvalidValue(f"must be {choices} (got {raw!r})") from None


LOG_FORMAT: Final = Setting(
    name="BLOCKX_LOG_FORMAT",
    default=LogFormat.TEXT,
    parse=log_format,
    help="text (one line for people) or json (one JSON object per line)",
)
LOG_WIRE: Final = Setting(
    name="BLOCKX_LOG_WIRE",
    default=False,
    parse=flag,
    help="log HTTP/2 frames and header compression (h2, hpack) at DEBUG too",
)
# Read by every program beside its own settings; --help lists them after those.
LOG_SETTINGS: Final[tuple[Setting[Any], ...]] = (LOG_FORMAT, LOG_WIRE)

# The loggers that log every HTTP/2 frame and header block at DEBUG.
WIRE_LOGGERS: Final = ("h2", "hpack")

# Where ``log_event`` puts an event's fields on the LogRecord.
_FIELDS: Final = "blockx_fields"


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    format: LogFormat = LogFormat.TEXT
    wire: bool = False


def read_log_settings(environ: Environ) -> LogSettings:
    """The logging settings of ``environ``; raises ConfigErrors naming each bad one."""
    reader = ConfigReader(EnvironSource(environ))
    settings = LogSettings(format=reader.get(LOG_FORMAT), wire=reader.get(LOG_WIRE))
    reader.finish()
    return settings


def log_event(
    logger: logging.Logger, message: str, fields: Mapping[str, object], level: int = logging.INFO
) -> None:
    """Log ``message`` with ``fields`` (JSON values) as the event's own keys."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={_FIELDS: fields})


def _fields(record: logging.LogRecord) -> Mapping[str, object]:
    fields: Mapping[str, object] = getattr(record, _FIELDS, {})
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the fixed keys first, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        # A value JSON has no type for is written as its text, never dropped.
        return msgspec.json.encode(entry, enc_hook=str).decode()


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = _fields(record)
        if not fields:
            return line
        pairs = " ".join(f"{key}={_text(value)}" for key, value in fields.items())
        return f"{line} {pairs}"


def configure_logging(level: str, settings: LogSettings, stream: TextIO | None = None) -> None:
    """Install the one stderr handler of the process at ``level``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.format is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in WIRE_LOGGERS:
        wire = logging.getLogger(name)
        wire.setLevel(logging.NOTSET if settings.wire else max(logging.INFO, root.level))


def _timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _text(value: object) -> str:
    text = "" if value is None else str(value)
    if text and " " not in text and '"' not in text:
        return text
    return msgspec.json.encode(text).decode()  # quoted: a value with blanks stays one field
