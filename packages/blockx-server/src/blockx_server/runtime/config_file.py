"""Settings from a TOML file (``--config FILE``), under the environment.

The file's keys are the environment variable names a program reads (its
``--help`` lists them), at the top level:

    COORDINATOR_LISTEN = "0.0.0.0:8080"
    ETCD_ENDPOINTS = ["etcd-0:2379", "etcd-1:2379"]
    TASK_SLOTS = 50
    EXECUTOR_SANDBOX = true

A value is written as TOML would have it and handed to the setting's parser as
the text the environment would hold: a string as it is, a number in decimal, a
boolean as ``true``/``false``, an array as its items joined by commas. A
variable that is set (and not blank) in the environment wins over the file, so
one file can serve a fleet and a variable can still adjust one process.

A key that is not a setting of the program is an error naming it (a misspelt key
would otherwise be ignored in silence), as is a value of another TOML type.

A section sets a family of settings: ``[iceberg]``'s ``catalog_uri = "..."`` is
ICEBERG_CATALOG_URI, and a table inside it (``[iceberg.catalog_properties]``) is
that setting's JSON object (ICEBERG_CATALOG_PROPERTIES), for a program that reads
those settings.

A program may also read tables of tables (the Worker's and the Sync Invoker's
``[chains.NAME]``): each value of ``[chains.base]`` is handed on as the setting
``chains.base.KEY`` (a name the environment cannot set), for the program to check.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

import msgspec

# Sections of the file, and the prefix of the settings each one sets.
SECTIONS: Final = {"iceberg": "ICEBERG_"}


class ConfigFileError(Exception):
    """The file cannot be used; each line of ``lines`` is one problem, for stderr."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def _scalar_text(value: object) -> str | None:
    # bool before int: True is an int to Python.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return None


def _text(value: object) -> str | None:
    """The environment's text for a TOML value; None when it has no such form."""
    if isinstance(value, list):
        items = [_scalar_text(item) for item in value]
        if any(item is None for item in items):
            return None
        return ",".join(item for item in items if item is not None)
    return _scalar_text(value)


def _unknown(key: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]}?" if close else " (--help lists the settings)"
    return f"unknown key {key}{hint}"


def read_config_file(
    path: Path, known: Collection[str], tables: Collection[str] = ()
) -> dict[str, str]:
    """The settings ``path`` holds, as environment text; ConfigFileError naming every
    unknown key and value of the wrong type, or why the file cannot be read.
    ``tables`` names the tables of tables the program reads (``chains``)."""
    document = _document(path)
    values: dict[str, str] = {}
    problems: list[str] = []
    for key, value in document.items():
        if key in tables:
            problems += _table_of_tables(path, key, value, values)
            continue
        if key in SECTIONS and isinstance(value, dict):
            problems += _section(path, key, value, known, values)
            continue
        if key not in known:
            problems.append(f"{path}: {_unknown(key, known)}")
            continue
        text = _text(value)
        if text is None:
            problems.append(
                f"{path}: {key} must be a string, a number, a boolean or an array of them"
            )
            continue
        values[key] = text
    if problems:
        raise ConfigFileError(problems)
    return values


def _table_of_tables(path: Path, key: str, value: object, values: dict[str, str]) -> list[str]:
    """``[key.NAME]`` tables flattened into ``values`` as ``key.NAME.FIELD``; the
    problems found."""
    if not isinstance(value, dict):
        return [f"{path}: {key} must be tables [{key}.NAME]"]
    problems: list[str] = []
    for name, table in value.items():
        if not isinstance(table, dict):
            problems.append(f"{path}: {key}.{name} must be a table [{key}.{name}]")
            continue
        for field, item in table.items():
            text = _scalar_text(item)
            if text is None:
                problems.append(
                    f"{path}: [{key}.{name}] {field} must be a string, a number or a boolean"
                )
                continue
            values[f"{key}.{name}.{field}"] = text
    return problems


def _section(
    path: Path, key: str, value: dict[str, Any], known: Collection[str], values: dict[str, str]
) -> list[str]:
    """``[key]``'s fields as the settings they name (a table inside it as JSON
    text); the problems found."""
    problems: list[str] = []
    prefix = SECTIONS[key]
    fields = [n.removeprefix(prefix).lower() for n in known if n.startswith(prefix)]
    for field, item in value.items():
        name = prefix + field.upper()
        if name not in known:
            problems.append(f"{path}: [{key}] {_unknown(field, fields)}")
            continue
        text = msgspec.json.encode(item).decode() if isinstance(item, dict) else _text(item)
        if text is None:
            problems.append(f"{path}: [{key}] {field} must be a string, a number or a boolean")
            continue
        values[name] = text
    return problems


def _document(path: Path) -> dict[str, Any]:
    """The TOML document ``path`` holds; ConfigFileError saying why it cannot be read."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError([f"cannot read {path}: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise ConfigFileError([f"{path} is not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError([f"{path} is not valid TOML: {exc}"]) from None


def read_tables(path: Path, table: str) -> dict[str, str]:
    """Only the ``[table.NAME]`` tables of ``path``, flattened as ``read_config_file``
    does (the file's other keys are another program's business); ConfigFileError
    for a file that cannot be read or a table that is malformed."""
    document = _document(path)
    values: dict[str, str] = {}
    problems = _table_of_tables(path, table, document.get(table, {}), values)
    if problems:
        raise ConfigFileError(problems)
    return values
