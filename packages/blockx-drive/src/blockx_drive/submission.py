"""What backfill and follow check once, before any task goes out.

A task that cannot succeed fails on the Worker the same way for every block: a
misspelled function would fail FUNCTION_NOT_FOUND once per task. So before it
submits anything, a driver checks, in this order:

* the source table and ``where``'s columns against the block database's schema
  (a table it does not have gets "Did you mean" its closest names);
* the sink table's name, and each declared column type against the type the
  sink has recorded for it: only a widening (INTEGER to NUMERIC) is a change
  the writer makes;
* the function against the cluster's code view: the Sync Invoker's precheck,
  whose FUNCTION_NOT_FOUND message is the one a Worker gives (the code view's
  "Did you mean"), with the one argument every call of a chain Builder passes.

A failed check raises ``SubmissionRefused`` (a ValueError) and nothing is
submitted. A Sync Invoker that cannot be asked leaves the function unchecked: the
driver goes on and says so (its first event's ``function_unchecked``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from blockx_chain.sink import SinkRejected, SinkStore
from blockx_chain.sink.schema import parse_types, plan, writable_table
from blockx_chain.store.reads import ROW_TABLES, rows
from blockx_chain.url import BlockDbUrl, PostgresUrl, SqliteUrl, parse_blockdb_url
from blockx_client.errors import BlockxError
from blockx_core.failures import PrecheckFailure

if TYPE_CHECKING:
    from blockx_client.client import Client

# The refusals a precheck can give: the function is not there, does not compile,
# or does not take one argument.
_REFUSING: Final = frozenset(
    {
        PrecheckFailure.FUNCTION_NOT_FOUND,
        PrecheckFailure.COMPILE_ERROR,
        PrecheckFailure.SIGNATURE_MISMATCH,
    }
)


class SubmissionRefused(ValueError):
    """A check before any task went out failed; nothing was submitted."""


def as_url(url: str | BlockDbUrl, what: str) -> BlockDbUrl:
    if isinstance(url, str):
        try:
            return parse_blockdb_url(url)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    return url


def writer_config_for(writer_config: Mapping[str, Any] | None, sink_table: str) -> dict[str, Any]:
    """The writer's config: ``writer_config`` with ``{"table": sink_table}``; its
    ``columns`` (name → INTEGER, TEXT, REAL, NUMERIC or JSON) are checked here, so a
    declaration the writer would refuse is refused before any task is submitted."""
    config = {**(writer_config or {}), "table": sink_table}
    columns = config.get("columns")
    if columns is not None:
        if not isinstance(columns, Mapping):
            raise ValueError(f"columns must map column names to types, got {columns!r}")
        try:
            parse_types(columns)
        except SinkRejected as exc:
            raise ValueError(f"columns: {exc}") from None
    return config


def did_you_mean(name: str, names: list[str]) -> str:
    """ " Did you mean 'x'?" for the names closest to ``name``; "" when none is."""
    close = difflib.get_close_matches(name, names, n=3)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(n) for n in close) + "?"


def check_source(source_table: str, where: Mapping[str, Any] | None) -> None:
    """SubmissionRefused unless the block database has ``source_table`` and
    ``where`` names its columns with values they can hold."""
    tables = list(ROW_TABLES)
    if source_table not in ROW_TABLES:
        raise SubmissionRefused(
            f"source table {source_table!r} is not a table of the block database "
            f"({', '.join(tables)}).{did_you_mean(source_table, tables)}"
        )
    try:
        rows(source_table, 0, 0, dict(where) if where is not None else None, 1)
    except (TypeError, ValueError) as exc:
        raise SubmissionRefused(f"where: {exc}") from None


async def check_sink(sink: SinkStore, sink_table: str, writer_config: Mapping[str, Any]) -> None:
    """SubmissionRefused when the writer would refuse ``sink_table`` or a declared
    column type of ``writer_config`` (one that is no widening of the recorded one)."""
    try:
        writable_table(sink_table)
        declared = parse_types(writer_config.get("columns"))
        if declared:
            known = await sink.column_types(sink_table)
            plan(sink_table, known, declared, {}, max_columns=len(known) + len(declared))
    except SinkRejected as exc:
        raise SubmissionRefused(f"sink table: {exc}") from None


async def check_function(client: Client, function: str) -> str:
    """SubmissionRefused when the cluster's code view has no ``function`` that
    takes one argument; why it could not be asked ("" when it was)."""
    try:
        checked = await client.function(function).precheck({})
    except BlockxError as exc:
        return (
            f"function {function!r} was not checked before submitting: the Sync Invoker "
            f"at {client.sync_invoker} could not be asked ({exc.message})"
        )
    if not checked.ok and checked.failure_code in _REFUSING:
        raise SubmissionRefused(f"{checked.failure_code}: {checked.message}")
    return ""


def url_text(url: BlockDbUrl) -> str:
    match url:
        case SqliteUrl(path):
            return f"sqlite:///{path}"
        case PostgresUrl(dsn=dsn):
            return dsn


def _shown(value: Any) -> Any:
    return url_text(value) if isinstance(value, SqliteUrl | PostgresUrl) else value


def call_command(name: str, arguments: Mapping[str, Any]) -> str:
    """The Python call ``name(**arguments)`` as a job record names it: the arguments
    that are not None, a database as its URL (a job record redacts its password)."""
    shown = ", ".join(
        f"{key}={_shown(value)!r}" for key, value in arguments.items() if value is not None
    )
    return f"{name}({shown})"
