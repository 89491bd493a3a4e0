"""The configuration layer every process reads its settings through.

A process validates its whole configuration before it logs anything. It reads
each declared ``Setting`` through one ``ConfigReader``, which collects every bad
value instead of stopping at the first, and ``finish()`` raises one
``ConfigErrors`` naming them all: a user fixes every variable in one round, and
each is one line on stderr. Values come from a ``Source``: the environment, which
with ``--config FILE`` is the environment over a TOML file
(``blockx_core.environ.EnvironOverFile``); the declarations do not change for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

import msgspec

from blockx_core.errors import InvalidConfig
from blockx_server.runtime.settings import InvalidValue, Setting

T = TypeVar("T")
C = TypeVar("C", bound="_Validating")


class ConfigError(Exception):
    """A configuration variable breaks a rule; ``str()`` is the one line users see."""

    def __init__(self, variable: str, rule: str) -> None:
        super().__init__(f"{variable} {rule}")
        self.variable = variable
        self.rule = rule


class ConfigErrors(ConfigError):
    """Every bad variable of one configuration, in the order they were read.

    ``errors`` holds one ConfigError per line; ``str()`` is those lines. As a
    ConfigError it names the first, for callers that want one variable.
    """

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        assert errors, "ConfigErrors needs at least one error"
        super().__init__(errors[0].variable, errors[0].rule)
        self.errors = tuple(errors)

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)


def each_error(exc: ConfigError) -> tuple[ConfigError, ...]:
    """The single errors behind ``exc``: itself, or every one a ConfigErrors holds."""
    return exc.errors if isinstance(exc, ConfigErrors) else (exc,)


Environ = Mapping[str, str]


class Source(Protocol):
    """Where the raw values of settings come from."""

    def lookup(self, name: str) -> str | None:
        """The text of ``name``, or None when it is unset or blank."""
        ...


class EnvironSource:
    """Environment variables; blanks around a value are ignored, a blank value is unset."""

    def __init__(self, environ: Environ) -> None:
        self._environ = environ

    def lookup(self, name: str) -> str | None:
        return self._environ.get(name, "").strip() or None

    def names(self) -> list[str]:
        return list(self._environ)


class _Validating(Protocol):
    def validate(self) -> None: ...


class ConfigReader:
    """Reads settings from one source and collects every rule they break.

    A bad value is reported and read as its setting's default, so the rest of the
    configuration can still be built and checked; ``finish()`` then raises. A rule
    over several variables is checked only when those variables are good
    (``valid``), so one mistake is never reported twice.
    """

    def __init__(self, source: Source) -> None:
        self._source = source
        self._errors: list[ConfigError] = []
        self._bad: set[str] = set()
        # Every setting read, in order: what --help must list (a test holds them equal).
        self.names_read: list[str] = []

    def get(self, setting: Setting[T]) -> T:
        """The value of ``setting``; its default when it is unset or bad (bad is reported)."""
        if setting.name not in self.names_read:
            self.names_read.append(setting.name)
        raw = self._source.lookup(setting.name)
        if raw is None:
            return setting.default
        try:
            return setting.parse(raw)
        except InvalidValue as exc:
            self.report(setting.name, exc.rule)
            return setting.default

    def raw(self, name: str) -> str | None:
        """The text the source holds for ``name`` (a table's key, checked by the caller)."""
        return self._source.lookup(name)

    def names_under(self, prefix: str) -> list[str]:
        """The names the source sets that start with ``prefix`` (a table of the
        ``--config`` file, ``chains.``), sorted; none from a source that cannot list."""
        names = getattr(self._source, "names", None)
        if names is None:
            return []
        return sorted(name for name in names() if name.startswith(prefix))

    def report(self, variable: str, rule: str) -> None:
        self._errors.append(ConfigError(variable, rule))
        self._bad.add(variable)

    def valid(self, *variables: str) -> bool:
        """No error has been reported for any of ``variables``."""
        return self._bad.isdisjoint(variables)

    def validate(self, config: C, variables: Mapping[str, str], defaults: C) -> C:
        """Report every rule ``config.validate()`` finds, in variable names.

        ``variables`` maps each field of ``config`` to the variable it is read from.
        ``validate()`` stops at the first broken rule, so the field it names is reset
        to its value in ``defaults`` and the check runs again. A rule that mentions a
        variable already reported is not reported again: it depends on a bad value.
        Returns the config with every bad field at its default.
        """
        for _ in range(len(variables) + 1):
            try:
                config.validate()
            except InvalidConfig as exc:
                variable = variables[exc.field]
                rule = exc.rule
                for field, name in variables.items():
                    # Whole words: slot_ttl_ms is also the end of workers_max_slot_ttl_ms.
                    rule = re.sub(rf"\b{re.escape(field)}\b", name, rule)
                if self.valid(variable) and not self._mentions_bad(rule):
                    self.report(variable, rule)
                reset = getattr(defaults, exc.field)
                if getattr(config, exc.field) == reset:
                    break  # the default itself breaks a rule: nothing more to learn
                # C is a msgspec Struct with validate(); the bound can only say one of them.
                config = msgspec.structs.replace(config, **{exc.field: reset})  # type: ignore[type-var]
            else:
                break
        return config

    def _mentions_bad(self, rule: str) -> bool:
        return any(re.search(rf"\b{re.escape(name)}\b", rule) for name in self._bad)

    def finish(self) -> None:
        """Raise ConfigErrors when any value was bad."""
        if self._errors:
            raise ConfigErrors(self._errors)
