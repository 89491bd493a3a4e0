"""Settings declared once: name, type, default, rule and a line of help.

A process lists the settings it reads; ``blockx_server.runtime.env.ConfigReader``
reads them from a ``Source`` and ``--help`` prints the same list, so the help
cannot drift from what is read. A parser turns the raw text of a value into its
type and raises ``InvalidValue`` with the rule the text broke; the reader adds the
variable's name in front (``"TASK_SLOTS must be >= 1 (got 0)"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, TypeVar

from blockx_core.addr import InvalidAddress, split_host_port

T = TypeVar("T")


class InvalidValue(Exception):
    """A value breaks its setting's rule; ``rule`` reads after the variable's name."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


@dataclass(frozen=True, kw_only=True)
class Setting(Generic[T]):
    """One variable. An unset or blank value means ``default`` (not parsed)."""

    name: str
    default: T
    parse: Callable[[str], T]
    help: str
    # How --help shows the default when ``str(default)`` would not say it well.
    shown_default: str | None = None

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value: object = self.default
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(str(item) for item in value)
        return str(value)


# Parsers. Each message is the rule after the variable's name, as users see it.


def text(raw: str) -> str:
    return raw


def optional_text(raw: str) -> str | None:
    return raw


def output_file(raw: str) -> str | None:
    """A file this process writes when it exits: its directory must exist now, so a
    mistyped path is refused at start-up rather than lost at the end of the run."""
    path = Path(raw)
    if path.is_dir():
        raise InvalidValue(f"must name a file, not a directory (got {raw!r})")
    if not path.parent.is_dir():
        raise InvalidValue(
            f"must be a file in an existing directory (no directory {str(path.parent)!r})"
        )
    return raw


def integer(
    *, at_least: int | None = None, above: int | None = None, at_most: int | None = None
) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise InvalidValue(f"must be an integer (got {raw!r})") from None
        if at_least is not None and value < at_least:
            raise InvalidValue(f"must be >= {at_least} (got {value})")
        if above is not None and value <= above:
            raise InvalidValue(f"must be > {above} (got {value})")
        if at_most is not None and value > at_most:
            raise InvalidValue(f"must be <= {at_most} (got {value})")
        return value

    return parse


def number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise InvalidValue(f"must be a number (got {raw!r})") from None


_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def flag(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidValue(f"must be true or false (got {lowered!r})")


def items(raw: str) -> tuple[str, ...]:
    """A comma-separated list; blanks around items are ignored."""
    parts = tuple(item.strip() for item in raw.split(","))
    if any(not item for item in parts):
        raise InvalidValue(f"has an empty item in its comma-separated list (got {raw!r})")
    return parts


def listen_address(raw: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (every interface, returned as host ``""``)."""
    try:
        return split_host_port(raw, allow_empty_host=True)
    except InvalidAddress as exc:
        raise InvalidValue(f"must be host:port or :port ({exc})") from None


def optional_listen_address(raw: str) -> tuple[str, int] | None:
    return listen_address(raw)


LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(raw: str) -> str:
    level = raw.upper()
    if level not in LOG_LEVELS:
        raise InvalidValue(f"must be one of {', '.join(LOG_LEVELS)} (got {level!r})")
    return level


def url_path(raw: str) -> str:
    if not raw.startswith("/"):
        raise InvalidValue(f"must start with '/' (got {raw!r})")
    return raw


# Settings more than one process reads.

LOG_LEVEL: Final = Setting(
    name="BLOCKX_LOG_LEVEL",
    default="INFO",
    parse=log_level,
    help="DEBUG, INFO, WARNING or ERROR",
)
PROMETHEUS_LISTEN_ADDR: Final = Setting(
    name="BLOCKX_PROMETHEUS_LISTEN_ADDR",
    default=None,
    parse=optional_listen_address,
    help="host:port of the Prometheus endpoint; unset: metrics off",
)
PROMETHEUS_PATH: Final = Setting(
    name="BLOCKX_PROMETHEUS_PATH",
    default="/metrics",
    parse=url_path,
    help="the path of the Prometheus endpoint",
)
ETCD_ENDPOINTS: Final[Setting[tuple[str, ...]]] = Setting(
    name="ETCD_ENDPOINTS",
    default=("localhost:2379",),
    parse=items,
    help="comma-separated host[:port] (optional http://)",
)
ETCD_CA_FILE: Final[Setting[str | None]] = Setting(
    name="ETCD_CA_FILE",
    default=None,
    parse=optional_text,
    help="PEM CA that signed etcd's certificate; set: etcd is dialled over TLS",
)
ETCD_CERT_FILE: Final[Setting[str | None]] = Setting(
    name="ETCD_CERT_FILE",
    default=None,
    parse=optional_text,
    help="PEM client certificate for etcd's --client-cert-auth (with ETCD_KEY_FILE)",
)
ETCD_KEY_FILE: Final[Setting[str | None]] = Setting(
    name="ETCD_KEY_FILE",
    default=None,
    parse=optional_text,
    help="PEM private key of ETCD_CERT_FILE",
)
ETCD_USERNAME: Final[Setting[str | None]] = Setting(
    name="ETCD_USERNAME",
    default=None,
    parse=optional_text,
    help="etcd user to authenticate as (with ETCD_PASSWORD)",
)
ETCD_PASSWORD: Final[Setting[str | None]] = Setting(
    name="ETCD_PASSWORD",
    default=None,
    parse=optional_text,
    help="password of ETCD_USERNAME; sent only over TLS (needs ETCD_CA_FILE)",
)
ETCD_SECURITY_SETTINGS: Final = (
    ETCD_CA_FILE,
    ETCD_CERT_FILE,
    ETCD_KEY_FILE,
    ETCD_USERNAME,
    ETCD_PASSWORD,
)
GRPC_TLS_CERT_FILE: Final[Setting[str | None]] = Setting(
    name="GRPC_TLS_CERT_FILE",
    default=None,
    parse=optional_text,
    help="PEM certificate: the gRPC server speaks TLS, and client calls present it",
)
GRPC_TLS_KEY_FILE: Final[Setting[str | None]] = Setting(
    name="GRPC_TLS_KEY_FILE",
    default=None,
    parse=optional_text,
    help="PEM private key of GRPC_TLS_CERT_FILE",
)
GRPC_TLS_CA_FILE: Final[Setting[str | None]] = Setting(
    name="GRPC_TLS_CA_FILE",
    default=None,
    parse=optional_text,
    help="PEM CA: the server requires client certificates it signed, clients verify servers",
)
GRPC_TLS_SETTINGS: Final = (GRPC_TLS_CERT_FILE, GRPC_TLS_KEY_FILE, GRPC_TLS_CA_FILE)
GRPC_KEEPALIVE_TIME_MS: Final = Setting(
    name="GRPC_KEEPALIVE_TIME_MS",
    default=30_000,
    parse=integer(at_least=1),
    help="HTTP/2 keepalive ping interval",
)
GRPC_KEEPALIVE_TIMEOUT_MS: Final = Setting(
    name="GRPC_KEEPALIVE_TIMEOUT_MS",
    default=10_000,
    parse=integer(at_least=1),
    help="an unanswered keepalive ping drops the connection after this long",
)
DRAIN_TIMEOUT_MS: Final = Setting(
    name="DRAIN_TIMEOUT_MS",
    default=30_000,
    parse=integer(at_least=0),
    help="on SIGTERM, how long running work may finish",
)
GRPC_MAX_RECEIVE_BYTES: Final = Setting(
    name="GRPC_MAX_RECEIVE_BYTES",
    default=16 * 1024 * 1024,
    parse=integer(at_least=1024),
    help="a larger request message is RESOURCE_EXHAUSTED, refused before it is read",
)
GRPC_IDLE_TIMEOUT_MS: Final = Setting(
    name="GRPC_IDLE_TIMEOUT_MS",
    default=300_000,
    parse=integer(at_least=1),
    help="a connection with no open call for this long is closed (GOAWAY)",
)
GRPC_HANDSHAKE_TIMEOUT_MS: Final = Setting(
    name="GRPC_HANDSHAKE_TIMEOUT_MS",
    default=10_000,
    parse=integer(at_least=1),
    help="a connection that has not sent the HTTP/2 preface within this is closed",
)
