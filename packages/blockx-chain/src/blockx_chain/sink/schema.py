"""The sink's tables, as data: identifiers, column types, inference and row checks.

Pure: no database. A table's column types are recorded in ``_blockx_columns``
(SQLite stores NUMERIC and JSON as TEXT, so the database's own types cannot tell
them apart); ``plan`` compares what a write brings with what is recorded and says
which columns to add, or why the write cannot be made.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import msgspec

from blockx_chain.sink.errors import SinkRejected

LEDGER: Final = "_blockx_written"
COLUMNS_TABLE: Final = "_blockx_columns"
# The block database's own tables: a sink on the same database never writes them.
CHAIN_TABLES: Final = frozenset(
    {"blocks", "transactions", "logs", "erc20_transfers", "chain", "reorgs", "blockx_schema"}
)
# Columns a block writer stamps on every row.
BLOCK_NUMBER: Final = "block_number"
BLOCK_HASH: Final = "block_hash"
CODE_EPOCH: Final = "code_epoch"
ROW_INDEX: Final = "row_index"

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
INT64: Final = (-(2**63), 2**63 - 1)


class SinkType(enum.StrEnum):
    INTEGER = "INTEGER"
    TEXT = "TEXT"
    REAL = "REAL"
    NUMERIC = "NUMERIC"
    JSON = "JSON"


STAMP_TYPES: Final = {
    BLOCK_NUMBER: SinkType.INTEGER,
    BLOCK_HASH: SinkType.TEXT,
    CODE_EPOCH: SinkType.INTEGER,
    ROW_INDEX: SinkType.INTEGER,
}


def identifier(name: Any, what: str) -> str:
    """``name`` checked as a table or column name (letters, digits, underscores, not
    starting with a digit, at most 63 characters), double-quoted for SQL."""
    if not isinstance(name, str) or _IDENTIFIER.fullmatch(name) is None:
        raise SinkRejected(
            f"{what} {name!r} is not a usable name (letters, digits and underscores, "
            "not starting with a digit, at most 63 characters)"
        )
    return f'"{name}"'


def writable_table(table: Any) -> str:
    """The quoted table name; SinkRejected for the block database's and BlockX's own."""
    quoted = identifier(table, "table")
    lowered = table.lower()
    if lowered in CHAIN_TABLES:
        raise SinkRejected(
            f"table {table!r} is a block database table: the sink never writes it "
            "(choose another table name)"
        )
    if lowered.startswith(("_blockx", "sqlite_", "pg_")):
        raise SinkRejected(f"table {table!r}: names starting with {lowered[:6]!r} are reserved")
    return quoted


def parse_types(columns: Mapping[str, Any] | None) -> dict[str, SinkType]:
    """A writer's ``columns`` declaration, checked."""
    declared: dict[str, SinkType] = {}
    for name, raw in (columns or {}).items():
        identifier(name, "column")
        try:
            declared[name] = SinkType(str(raw).upper())
        except ValueError:
            kinds = "|".join(t.value for t in SinkType)
            raise SinkRejected(f"column {name!r} has type {raw!r}, not one of {kinds}") from None
    return declared


def infer(value: Any) -> SinkType | None:
    """The type a column gets from its first value; None for null (no type yet)."""
    match value:
        case None:
            return None
        case bool() | int():
            return SinkType.INTEGER if INT64[0] <= value <= INT64[1] else SinkType.NUMERIC
        case float():
            return SinkType.REAL
        case str():
            return SinkType.TEXT
        case _:
            return SinkType.JSON


# Which inferred types two values of one new column may widen to.
_WIDER: Final = {
    frozenset({SinkType.INTEGER, SinkType.REAL}): SinkType.REAL,
    frozenset({SinkType.INTEGER, SinkType.NUMERIC}): SinkType.NUMERIC,
}


class Plan(msgspec.Struct, frozen=True):
    """What a write needs: the columns to add (name, type), and every column's type."""

    added: list[tuple[str, SinkType]]
    types: dict[str, SinkType]


def plan(
    table: str,
    known: Mapping[str, SinkType],
    declared: Mapping[str, SinkType],
    rows: Sequence[Mapping[str, Any]],
) -> Plan:
    """The columns ``rows`` and ``declared`` add to ``known`` (the recorded types);
    SinkRejected when a declared type differs from the recorded one or one new
    column gets values of two types."""
    types = dict(known)
    added: dict[str, SinkType] = {}
    for name, kind in declared.items():
        recorded = types.get(name)
        if recorded is not None and recorded is not kind:
            raise SinkRejected(
                f"column {name!r} of table {table!r} is {recorded}, the writer declares {kind}: "
                "a column's type cannot change (write into a new table or column)"
            )
        if recorded is None:
            types[name] = added[name] = kind
    brought: set[str] = set().union(*rows)
    if brought <= types.keys() and (
        brought.isdisjoint(added) or len({n.lower() for n in types}) == len(types)
    ):
        # Every column the rows bring is recorded or declared, and no two differ only
        # by case: the loop below would find nothing to add or refuse.
        return Plan(added=list(added.items()), types=types)
    lowered = {name.lower(): name for name in types}
    for row in rows:
        for name, value in row.items():
            if name in types and name not in added:
                continue
            inferred = infer(value)
            if inferred is None:
                continue
            kind = inferred
            identifier(name, "column")
            twin = lowered.get(name.lower())
            if twin is not None and twin != name:
                raise SinkRejected(f"columns {twin!r} and {name!r} differ only by case")
            if name in added and name not in declared and added[name] is not kind:
                wider = _WIDER.get(frozenset({added[name], kind}))
                if wider is None:
                    raise SinkRejected(
                        f"new column {name!r} of table {table!r} gets both {added[name]} "
                        f"and {kind} values"
                    )
                kind = wider
            if name not in declared:
                types[name] = added[name] = kind
                lowered[name.lower()] = name
    return Plan(added=list(added.items()), types=types)


_json = msgspec.json.Encoder()


def cell(table: str, column: str, kind: SinkType, value: Any, postgres: bool) -> Any:
    """``value`` as the database stores it in a ``kind`` column; SinkRejected naming
    the column when it does not fit."""
    if value is None:
        return None
    match kind:
        case SinkType.INTEGER:
            if isinstance(value, int) and INT64[0] <= value <= INT64[1]:
                return int(value)
        case SinkType.REAL:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        case SinkType.TEXT:
            if isinstance(value, str):
                return value
        case SinkType.NUMERIC:
            number = _decimal(value)
            if number is not None:
                return number if postgres else format(number, "f")
        case SinkType.JSON:
            try:
                return _json.encode(value).decode()
            except (TypeError, ValueError):
                pass
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise SinkRejected(
        f"column {column!r} of table {table!r} is {kind}: the value {shown} "
        f"({type(value).__name__}) does not fit"
    )


def _decimal(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        return None
    try:
        number = Decimal(value)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def sql_type(kind: SinkType, postgres: bool) -> str:
    if postgres:
        return {
            SinkType.INTEGER: "BIGINT",
            SinkType.TEXT: "TEXT",
            SinkType.REAL: "DOUBLE PRECISION",
            SinkType.NUMERIC: "NUMERIC",
            SinkType.JSON: "JSONB",
        }[kind]
    # SQLite: NUMERIC as TEXT, so integers beyond 64 bits stay exact.
    return {
        SinkType.INTEGER: "INTEGER",
        SinkType.TEXT: "TEXT",
        SinkType.REAL: "REAL",
        SinkType.NUMERIC: "TEXT",
        SinkType.JSON: "TEXT",
    }[kind]
