"""An address setting as resolved: its value and where that value came from.

``LayeredEnviron.setting`` (``dev_config``) resolves one; an error about reaching
the address it names carries it (``ConnectError.setting``) and says, through
``with_origin``, where the address came from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Origin(enum.Enum):
    """Where a setting's value came from; each wins over the ones below it."""

    GIVEN = "given"  # a flag or an argument
    ENVIRONMENT = "environment"
    DEV_CONFIG = "dev.toml"
    DEFAULT = "default"


@dataclass(frozen=True, kw_only=True)
class Setting:
    """An address as resolved: its ``value`` (None: none at all), its ``origin``,
    and what the running ``dev up``'s dev.toml says (None: it names none, or no
    ``dev up`` runs), which tells an export left from an earlier one."""

    variable: str
    value: str | None
    origin: Origin
    dev_value: str | None = None

    def origin_text(self, given_as: str | None = None) -> str | None:
        """Where the value came from, in words for an error about reaching it.

        A value the caller gave is described only with ``given_as`` (how it was
        given, e.g. ``--coordinator``): otherwise the caller knows best, and None."""
        match self.origin:
            case Origin.DEV_CONFIG:
                return f"{self.variable} from the running `blockx dev up`'s dev.toml"
            case Origin.DEFAULT:
                return f"the default: no {self.variable} set and no `blockx dev up` running"
            case Origin.ENVIRONMENT:
                where, undo = f"{self.variable} from the environment", f"unset {self.variable}"
            case Origin.GIVEN:
                if given_as is None:
                    return None
                where, undo = f"from {given_as}", f"leave {given_as} out"
        if self.dev_value is not None and self.dev_value != self.value:
            where += f"; dev.toml says {self.dev_value} — {undo}?"
        return where


def with_origin(message: str, setting: Setting | None) -> str:
    """``message`` and, in parentheses, where ``setting`` came from (unless the
    caller gave it)."""
    said = None if setting is None else setting.origin_text()
    return message if said is None else f"{message} ({said})"
