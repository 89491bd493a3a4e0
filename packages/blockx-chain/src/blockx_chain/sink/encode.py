"""Rows to the values the database stores, column by column.

``schema.cell`` says what a value becomes in a column of a type, and why it does
not fit. Called once per cell it costs more than the insert itself, so a batch is
converted a column at a time: the set of Python types in the column picks a
converter (a column of plain ``int`` into INTEGER needs only a range check, a
column of ``str`` into TEXT nothing at all), and only a column of other types goes
through ``cell`` per value. When a column does not fit, or a key column has a
null, the batch is converted again row by row, so the error raised is the one of
the first row that does not fit, as it would be without the column pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

from blockx_chain.sink.errors import SinkRejected
from blockx_chain.sink.schema import INT64, NUMERIC_BOUND, SinkType, cell

_NONE: Final = type(None)
_INTS: Final = frozenset({int, _NONE})
_STRS: Final = frozenset({str, _NONE})
_FLOATS: Final = frozenset({float, _NONE})
_NUMBERS: Final = frozenset({float, int, _NONE})


class _RowByRow(Exception):
    """The column pass cannot vouch for a column: convert the batch row by row."""


def encode_rows(
    table: str,
    kinds: Sequence[SinkType],
    names: Sequence[str],
    columns: Sequence[list[Any]],
    key: Sequence[str],
    postgres: bool,
) -> list[tuple[Any, ...]]:
    """The rows to insert: ``columns[i]`` holds column ``names[i]`` (of type
    ``kinds[i]``) of every row, None where a row has no value. SinkRejected naming
    the column of the first row that does not fit, or the key column it lacks."""
    if any(name not in names for name in key):
        return _row_by_row(table, kinds, names, columns, key, postgres)
    try:
        converted = [
            _column(table, name, kind, values, postgres, name in key)
            for name, kind, values in zip(names, kinds, columns, strict=True)
        ]
    except _RowByRow:
        return _row_by_row(table, kinds, names, columns, key, postgres)
    return list(zip(*converted, strict=True))


def _column(
    table: str, name: str, kind: SinkType, values: list[Any], postgres: bool, is_key: bool
) -> list[Any]:
    types = set(map(type, values))
    if is_key and _NONE in types:
        raise _RowByRow
    match kind:
        case SinkType.TEXT if types <= _STRS:
            return values
        case SinkType.INTEGER if types <= _INTS:
            if _within(values, _NONE in types, INT64[0], INT64[1]):
                return values
            raise _RowByRow
        case SinkType.REAL if types <= _FLOATS:
            return values
        case SinkType.REAL if types <= _NUMBERS:
            try:
                return [None if v is None else float(v) for v in values]
            except OverflowError:  # an int beyond a float's range: let cell say
                raise _RowByRow from None
        case SinkType.NUMERIC if types <= _INTS:
            if not _within(values, _NONE in types, -NUMERIC_BOUND + 1, NUMERIC_BOUND - 1):
                raise _RowByRow
            # An int's decimal text is what format(Decimal(v), "f") gives.
            if postgres:
                return [None if v is None else Decimal(v) for v in values]
            return [None if v is None else str(v) for v in values]
        case _:
            pass
    try:
        return [cell(table, name, kind, v, postgres) for v in values]
    except SinkRejected:
        raise _RowByRow from None


def _within(values: list[Any], nulls: bool, low: int, high: int) -> bool:
    """Whether every int of ``values`` (ints, and None where ``nulls``) is in [low, high]."""
    present = [v for v in values if v is not None] if nulls else values
    return not present or (min(present) >= low and max(present) <= high)


def _row_by_row(
    table: str,
    kinds: Sequence[SinkType],
    names: Sequence[str],
    columns: Sequence[list[Any]],
    key: Sequence[str],
    postgres: bool,
) -> list[tuple[Any, ...]]:
    index = {name: i for i, name in enumerate(names)}
    keyed = [(name, index.get(name)) for name in key]
    rows: list[tuple[Any, ...]] = []
    for r in range(len(columns[0]) if columns else 0):
        for name, i in keyed:
            if i is None or columns[i][r] is None:
                raise SinkRejected(f"a row of table {table!r} has no key column {name!r}")
        rows.append(
            tuple(
                cell(table, name, kind, values[r], postgres)
                for name, kind, values in zip(names, kinds, columns, strict=True)
            )
        )
    return rows
