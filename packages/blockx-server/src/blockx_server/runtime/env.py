"""Reading configuration from environment variables.

Every process validates its whole configuration before it logs anything; a bad
value stops start-up with one line naming the variable and the rule it broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from blockx_core.addr import InvalidAddress, split_host_port
from blockx_core.errors import InvalidConfig


class ConfigError(Exception):
    """A configuration variable breaks a rule; ``str()`` is the one line users see."""

    def __init__(self, variable: str, rule: str) -> None:
        super().__init__(f"{variable} {rule}")
        self.variable = variable
        self.rule = rule


Environ = Mapping[str, str]


class _Validating(Protocol):
    def validate(self) -> None: ...


def validate_in_env_names(config: _Validating, variables: Mapping[str, str]) -> None:
    """``config.validate()``; its InvalidConfig becomes a ConfigError that names the
    variable behind the field, and says the rule in variable names too.

    ``variables`` maps every field of ``config`` to the variable it is read from.
    """
    try:
        config.validate()
    except InvalidConfig as exc:
        rule = exc.rule
        for field, variable in variables.items():
            rule = rule.replace(field, variable)
        raise ConfigError(variables[exc.field], rule) from None


def env_str(environ: Environ, name: str, default: str) -> str:
    value = environ.get(name, "").strip()
    return value or default


def env_optional(environ: Environ, name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def env_int(environ: Environ, name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(name, f"must be an integer (got {raw!r})") from None


def env_float(environ: Environ, name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number (got {raw!r})") from None


def env_list(environ: Environ, name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list; blanks around items are ignored."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    items = tuple(item.strip() for item in raw.split(","))
    if any(not item for item in items):
        raise ConfigError(name, f"has an empty item in its comma-separated list (got {raw!r})")
    return items


def env_listen_addr(environ: Environ, name: str, default: str) -> tuple[str, int]:
    """``host:port`` or ``:port`` (every interface, returned as host ``""``)."""
    raw = env_str(environ, name, default)
    try:
        return split_host_port(raw, allow_empty_host=True)
    except InvalidAddress as exc:
        raise ConfigError(name, f"must be host:port or :port ({exc})") from None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def env_log_level(environ: Environ) -> str:
    """``BLOCKX_LOG_LEVEL``, shared by every process (default INFO)."""
    level = env_str(environ, "BLOCKX_LOG_LEVEL", "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigError(
            "BLOCKX_LOG_LEVEL", f"must be one of {', '.join(LOG_LEVELS)} (got {level!r})"
        )
    return level


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_bool(environ: Environ, name: str, default: bool) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(name, f"must be true or false (got {raw!r})")


def env_int_at_least(environ: Environ, name: str, default: int, minimum: int) -> int:
    value = env_int(environ, name, default)
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum} (got {value})")
    return value


def env_prometheus(environ: Environ) -> tuple[tuple[str, int] | None, str]:
    """``BLOCKX_PROMETHEUS_LISTEN_ADDR`` (None = metrics off) and ``BLOCKX_PROMETHEUS_PATH``."""
    listen = None
    if env_optional(environ, "BLOCKX_PROMETHEUS_LISTEN_ADDR"):
        listen = env_listen_addr(environ, "BLOCKX_PROMETHEUS_LISTEN_ADDR", "")
    path = env_str(environ, "BLOCKX_PROMETHEUS_PATH", "/metrics")
    if not path.startswith("/"):
        raise ConfigError("BLOCKX_PROMETHEUS_PATH", f"must start with '/' (got {path!r})")
    return listen, path
