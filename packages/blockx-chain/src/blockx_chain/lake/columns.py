"""A lake table's columns: sink types as Iceberg types, and rows as Arrow columns.

Each column records its sink type in its Iceberg field's ``doc``
(``blockx:INTEGER``...), since TEXT and JSON are both Iceberg strings. INTEGER is
a ``long``, TEXT and JSON (its JSON text) a ``string``, REAL a ``double``, and
NUMERIC a ``decimal(38, scale)``: Iceberg decimals stop at 38 digits, and a
column's scale is the most digits after the point its first write brings. A
value beyond them is refused (not retryable), naming the column and suggesting
TEXT. Every column is optional (nullable), so later writes may add columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Context, Decimal
from typing import TYPE_CHECKING, Any, Final

from blockx_chain.sink.encode import encode_rows
from blockx_chain.sink.errors import SinkRejected
from blockx_chain.sink.schema import SinkType, retype_hint

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

DECIMAL_DIGITS: Final = 38
_DOC: Final = "blockx:"
# Wide enough for any NUMERIC value (78 digits on each side of the point).
_EXACT: Final = Context(prec=160)


def sink_types(schema: Schema) -> dict[str, SinkType]:
    """The sink type of each column of a table this writer made (or that the
    Iceberg type alone tells)."""
    from pyiceberg.types import DecimalType, DoubleType, IntegerType, LongType

    types: dict[str, SinkType] = {}
    for field in schema.fields:
        doc = field.doc or ""
        if doc.startswith(_DOC) and doc[len(_DOC) :] in SinkType.__members__:
            types[field.name] = SinkType(doc[len(_DOC) :])
        elif isinstance(field.field_type, LongType | IntegerType):
            types[field.name] = SinkType.INTEGER
        elif isinstance(field.field_type, DoubleType):
            types[field.name] = SinkType.REAL
        elif isinstance(field.field_type, DecimalType):
            types[field.name] = SinkType.NUMERIC
        else:
            types[field.name] = SinkType.TEXT
    return types


def iceberg_type(kind: SinkType, scale: int) -> IcebergType:
    from pyiceberg.types import DecimalType, DoubleType, LongType, StringType

    match kind:
        case SinkType.INTEGER:
            return LongType()
        case SinkType.REAL:
            return DoubleType()
        case SinkType.NUMERIC:
            return DecimalType(DECIMAL_DIGITS, scale)
        case SinkType.TEXT | SinkType.JSON:
            return StringType()


def doc(kind: SinkType) -> str:
    return f"{_DOC}{kind.value}"


def encoded(
    table: str, names: Sequence[str], kinds: Sequence[SinkType], columns: Sequence[list[Any]]
) -> list[list[Any]]:
    """The columns as the lake stores them (NUMERIC as Decimal, JSON as text);
    SinkRejected naming the first row's value that does not fit."""
    rows = encode_rows(table, kinds, names, columns, (), True)
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in names]


def scale_of(values: Sequence[Any]) -> int:
    """The digits after the point a new NUMERIC column needs for ``values``
    (Decimals and None), at most 38."""
    scale = 0
    for value in values:
        if isinstance(value, Decimal):
            exponent = value.as_tuple().exponent
            if isinstance(exponent, int) and exponent < 0:
                scale = max(scale, -exponent)
    return min(scale, DECIMAL_DIGITS)


def decimals(table: str, column: str, values: list[Any], scale: int) -> list[Any]:
    """``values`` (Decimals and None) at the column's ``scale``; SinkRejected (not
    retryable) for one that needs more digits than a decimal(38, scale) holds."""
    quantum = Decimal(1).scaleb(-scale)
    bound = Decimal(10) ** (DECIMAL_DIGITS - scale)
    out: list[Any] = []
    for value in values:
        if value is None:
            out.append(None)
            continue
        exact = value.quantize(quantum, context=_EXACT) if abs(value) < bound else None
        if exact is None or exact != value:
            raise SinkRejected(
                f"column {column!r} of table {table!r} is an Iceberg decimal(38, {scale}): "
                f"the value {value} needs more digits than its 38 (Iceberg decimals stop "
                f"there); write it as TEXT, {retype_hint(column, None, SinkType.TEXT)}"
            )
        out.append(exact)
    return out


def arrow_table(schema: pa.Schema, columns: Mapping[str, list[Any]], count: int) -> pa.Table:
    """The rows as Arrow, in the table's ``schema`` (a column not written: nulls)."""
    import pyarrow as pa

    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(count, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)
