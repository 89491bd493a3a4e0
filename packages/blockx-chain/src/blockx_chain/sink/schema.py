"""The sink's tables, as data: identifiers, column types, inference, widening and
row checks.

Pure: no database. A table's column types are recorded in ``_blockx_columns``
(SQLite stores NUMERIC and JSON as TEXT, so the database's own types cannot tell
them apart); ``plan`` compares what a write brings (each column's ``Values``)
with what is recorded and says which columns to add and which to widen, or why
the write cannot be made.

Every name the writers give the database themselves (their tables, indexes and
constraints) starts with ``_blockx_``, a prefix no sink table may take, so no
table a user names can collide with one of them.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

import msgspec

from blockx_chain.schema import TABLES as BLOCK_DB_TABLES
from blockx_chain.sink.errors import SinkRejected

LEDGER: Final = "_blockx_written"
COLUMNS_TABLE: Final = "_blockx_columns"
# One row: the sink's identity, and the version of the writers' own layout.
SINK_TABLE: Final = "_blockx_sink"
# The drivers' job records (``blockx_chain.sink.jobs``).
JOBS_TABLE: Final = "_blockx_jobs"
# The block database's own tables (every table of its schema, and its version
# table): a sink on the same database never writes them.
CHAIN_TABLES: Final = frozenset({t.name for t in BLOCK_DB_TABLES} | {"blockx_schema"})
RESERVED_PREFIXES: Final = ("_blockx", "sqlite_", "pg_")
# Columns a block writer stamps on every row.
CHAIN_ID: Final = "chain_id"
BLOCK_NUMBER: Final = "block_number"
BLOCK_HASH: Final = "block_hash"
CODE_EPOCH: Final = "code_epoch"
ROW_INDEX: Final = "row_index"

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
INT64: Final = (-(2**63), 2**63 - 1)
# A NUMERIC value has at most this many digits before the point, and as many
# after (a uint256 has 78): decimal text of any length would cost memory and disk
# in proportion to its exponent, not its size.
NUMERIC_DIGITS: Final = 78
NUMERIC_BOUND: Final = 10**NUMERIC_DIGITS
_PLAIN_DECIMAL: Final = re.compile(
    rf"[+-]?(?:[0-9]{{1,{NUMERIC_DIGITS}}}(?:\.[0-9]{{0,{NUMERIC_DIGITS}}})?"
    rf"|\.[0-9]{{1,{NUMERIC_DIGITS}}})"
)
PLAIN_DECIMAL_RULE: Final = (
    f"a plain decimal: an optional sign, at most {NUMERIC_DIGITS} digits before the point "
    f"and {NUMERIC_DIGITS} after it, no exponent"
)


class SinkType(enum.StrEnum):
    INTEGER = "INTEGER"
    TEXT = "TEXT"
    REAL = "REAL"
    NUMERIC = "NUMERIC"
    JSON = "JSON"


STAMP_TYPES: Final = {
    CHAIN_ID: SinkType.INTEGER,
    BLOCK_NUMBER: SinkType.INTEGER,
    BLOCK_HASH: SinkType.TEXT,
    CODE_EPOCH: SinkType.INTEGER,
    ROW_INDEX: SinkType.INTEGER,
}

# What a column of each type can be widened to, losing nothing: every 64-bit
# integer is a decimal. A column is never narrowed.
WIDENINGS: Final[Mapping[SinkType, frozenset[SinkType]]] = {
    SinkType.INTEGER: frozenset({SinkType.NUMERIC}),
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


def quoted(name: str) -> str:
    """A name the database gave (an index, a table of an older sink), quoted for SQL."""
    return '"' + name.replace('"', '""') + '"'


def writable_table(table: Any) -> str:
    """The quoted table name; SinkRejected for the block database's and BlockX's own."""
    quoted = identifier(table, "table")
    lowered = table.lower()
    if lowered in CHAIN_TABLES:
        raise SinkRejected(
            f"table {table!r} is a block database table: the sink never writes it "
            "(choose another table name)"
        )
    for prefix in RESERVED_PREFIXES:
        if lowered.startswith(prefix):
            raise SinkRejected(
                f"table {table!r}: names starting with {prefix!r} are reserved "
                "(choose another table name)"
            )
    return quoted


def index_name(kind: str, table: str, columns: Sequence[str], *, legacy: bool = False) -> str:
    """The name of the writers' index of ``kind`` (``ux`` unique, ``ix`` plain) on
    ``table``'s ``columns``; ``legacy``: the name sinks made before index names
    moved under ``_blockx_`` (which a user table could take)."""
    digest = hashlib.sha1("\0".join([table, *columns]).encode()).hexdigest()[:16]
    return f"{kind}_{digest}" if legacy else f"_blockx_{kind}_{digest}"


def parse_types(columns: Mapping[str, Any] | None) -> dict[str, SinkType]:
    """A writer's ``columns`` declaration, checked."""
    declared: dict[str, SinkType] = {}
    lowered: dict[str, str] = {}
    for name, raw in (columns or {}).items():
        identifier(name, "column")
        twin = lowered.setdefault(name.lower(), name)
        if twin != name:
            raise SinkRejected(f"declared columns {twin!r} and {name!r} differ only by case")
        try:
            declared[name] = SinkType(str(raw).upper())
        except ValueError:
            kinds = "|".join(t.value for t in SinkType)
            raise SinkRejected(f"column {name!r} has type {raw!r}, not one of {kinds}") from None
    return declared


def infer(value: Any) -> SinkType | None:
    """The type a column gets from a value; None for null (no type yet)."""
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


class Values(msgspec.Struct, frozen=True):
    """What a write brings in one column: the Python types of its values (null
    aside), and the smallest and largest of its ints (bools aside; None without)."""

    types: frozenset[type]
    low: int | None = None
    high: int | None = None

    @classmethod
    def of(cls, column: Sequence[Any]) -> Values:
        types = set(map(type, column))
        nulls = type(None) in types
        types.discard(type(None))
        if int not in types:
            return cls(frozenset(types))
        ints = column if types == {int} and not nulls else [v for v in column if type(v) is int]
        return cls(frozenset(types), min(ints), max(ints))

    def kinds(self) -> set[SinkType]:
        """The types these values would give a new column, one per kind of value."""
        kinds: set[SinkType] = set()
        for kind in self.types:
            if issubclass(kind, bool):
                kinds.add(SinkType.INTEGER)
            elif issubclass(kind, int):
                wide = (
                    self.low is not None
                    and self.high is not None
                    and (self.low < INT64[0] or self.high > INT64[1])
                )
                kinds.add(SinkType.NUMERIC if wide else SinkType.INTEGER)
            elif issubclass(kind, float):
                kinds.add(SinkType.REAL)
            elif issubclass(kind, str):
                kinds.add(SinkType.TEXT)
            else:
                kinds.add(SinkType.JSON)
        return kinds

    def bounded(self) -> bool:
        """Whether every int has at most NUMERIC_DIGITS digits (a NUMERIC column holds
        it): a column is not widened for a value it would still refuse."""
        return (
            self.low is None
            or self.high is None
            or (self.low > -NUMERIC_BOUND and self.high < NUMERIC_BOUND)
        )


# The one type that holds values of two types, when there is one.
_WIDER: Final = {
    frozenset({SinkType.INTEGER, SinkType.REAL}): SinkType.REAL,
    frozenset({SinkType.INTEGER, SinkType.NUMERIC}): SinkType.NUMERIC,
}


def _holding(kinds: set[SinkType]) -> SinkType | None:
    """The type that holds values of all these ``kinds``; None when none does."""
    if len(kinds) == 1:
        return next(iter(kinds))
    return _WIDER.get(frozenset(kinds))


def retype_hint(column: str, current: SinkType | None, wanted: SinkType) -> str:
    """How a user makes ``column`` (now of type ``current``, None while it is new)
    a ``wanted`` column."""
    flags = (
        f"--column {column}={wanted} on blockx backfill or follow, "
        f"writer_config={{'columns': {{{column!r}: {wanted.value!r}}}}} in the Python API"
    )
    if current is None:
        return f"declare its type: {flags}"
    if wanted in WIDENINGS.get(current, ()):
        return f"declare it {wanted}, which widens it: {flags}"
    return (
        "a column's type only ever widens (INTEGER to NUMERIC): give the column its type "
        f"before its table's first write ({flags}), in a new table or once this one is dropped"
    )


class Plan(msgspec.Struct, frozen=True):
    """What a write needs: the columns to add (name, type), the columns to widen
    (name, recorded type, new type), and every column's type once it is done."""

    added: list[tuple[str, SinkType]]
    widened: list[tuple[str, SinkType, SinkType]]
    types: dict[str, SinkType]


def plan(
    table: str,
    known: Mapping[str, SinkType],
    declared: Mapping[str, SinkType],
    brought: Mapping[str, Values],
    *,
    max_columns: int,
) -> Plan:
    """The columns ``declared`` and ``brought`` (the rows' columns, each with its
    values) add to ``known`` (the recorded types), and the ones they widen.

    A declared type wins: a new column gets it, a recorded type it widens is
    widened, a wider recorded type is kept. An undeclared column gets the type of
    its values (INTEGER and REAL values give REAL, INTEGER and NUMERIC values
    NUMERIC); a recorded column whose values need a widening of its type is
    widened. SinkRejected for a declared type that is no widening of the recorded
    one, a new column whose values have no one type, two columns that differ only
    by case, and a table with more than ``max_columns`` columns. A value that does
    not fit a recorded column is left to the encoding, which names its row."""
    types = dict(known)
    added: dict[str, SinkType] = {}
    widened: dict[str, tuple[SinkType, SinkType]] = {}
    lowered = {name.lower(): name for name in known}

    def add(name: str, kind: SinkType) -> None:
        twin = lowered.setdefault(name.lower(), name)
        if twin != name:
            raise SinkRejected(
                f"columns {twin!r} and {name!r} of table {table!r} differ only by case"
            )
        types[name] = added[name] = kind

    def widen(name: str, recorded: SinkType, kind: SinkType) -> None:
        types[name] = kind
        widened[name] = (recorded, kind)

    for name, kind in declared.items():
        recorded = known.get(name)
        if recorded is None:
            add(name, kind)
        elif kind in WIDENINGS.get(recorded, ()):
            widen(name, recorded, kind)
        elif kind is not recorded and recorded not in WIDENINGS.get(kind, ()):
            raise SinkRejected(
                f"column {name!r} of table {table!r} is {recorded}, the writer declares {kind}, "
                f"which is no widening of {recorded}: {retype_hint(name, recorded, kind)}"
            )
    for name, values in brought.items():
        if name in declared or not values.types:
            continue
        kinds = values.kinds()
        holding = _holding(kinds)
        recorded = known.get(name)
        if recorded is None:
            identifier(name, "column")
            if holding is None:
                both = " and ".join(sorted(kinds))
                raise SinkRejected(
                    f"new column {name!r} of table {table!r} gets both {both} values: "
                    f"{retype_hint(name, None, SinkType.JSON)}"
                )
            add(name, holding)
        elif holding is not None and holding in WIDENINGS.get(recorded, ()) and values.bounded():
            widen(name, recorded, holding)
    if len(types) > max_columns:
        raise SinkRejected(
            f"table {table!r} would have {len(types)} columns, more than the sink database "
            f"allows ({max_columns}): write fewer columns (several values can share one "
            "JSON column)"
        )
    return Plan(
        added=list(added.items()),
        widened=[(name, old, new) for name, (old, new) in widened.items()],
        types=types,
    )


_json = msgspec.json.Encoder()


def cell(table: str, column: str, kind: SinkType, value: Any, postgres: bool) -> Any:
    """``value`` as the database stores it in a ``kind`` column; SinkRejected naming
    the column, its type and the value's when it does not fit."""
    if value is None:
        return None
    match kind:
        case SinkType.INTEGER:
            if isinstance(value, int) and INT64[0] <= value <= INT64[1]:
                return int(value)
        case SinkType.REAL:
            if isinstance(value, int | float) and not isinstance(value, bool):
                try:
                    return float(value)
                except OverflowError:
                    pass
        case SinkType.TEXT:
            if isinstance(value, str):
                return value
        case SinkType.NUMERIC:
            number = decimal(value)
            if number is not None:
                return number if postgres else format(number, "f")
        case SinkType.JSON:
            try:
                return _json.encode(value).decode()
            except (TypeError, ValueError):
                pass
    raise SinkRejected(misfit(table, column, kind, value))


def misfit(table: str, column: str, kind: SinkType, value: Any) -> str:
    """Why ``value`` does not fit ``column`` (of type ``kind``), and what would."""
    said = f"column {column!r} of table {table!r} is {kind}: the value {_shown(value)} does not fit"
    wanted = infer(value)
    if kind is SinkType.NUMERIC and isinstance(value, int | str | float):
        return f"{said}; a NUMERIC value is {PLAIN_DECIMAL_RULE}"
    if wanted is None or wanted is kind:
        return said
    return f"{said}, it is {wanted}: {retype_hint(column, kind, wanted)}"


def _shown(value: Any) -> str:
    """``value`` for a message, at most 80 characters."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<an int of {value.bit_length()} bits>"
    return text if len(text) <= 80 else text[:77] + "..."


def decimal(value: Any) -> Decimal | None:
    """``value`` as a Decimal when it is a NUMERIC value: an int, a float or decimal
    text of at most NUMERIC_DIGITS digits on each side of the point, no exponent."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value) if -NUMERIC_BOUND < value < NUMERIC_BOUND else None
    if isinstance(value, str):
        return Decimal(value) if _PLAIN_DECIMAL.fullmatch(value) else None
    if isinstance(value, float) and math.isfinite(value):
        number = Decimal(value)  # exact: a float is a binary fraction
        _, digits, exponent = number.as_tuple()
        assert isinstance(exponent, int)
        if len(digits) + exponent <= NUMERIC_DIGITS and -exponent <= NUMERIC_DIGITS:
            return number
    return None


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
