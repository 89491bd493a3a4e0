"""checked_row, the hot path ingest checks every cell through, agrees with the
schema's rules column by column (check_value): the same stored values for any row,
the same refusal, naming the same cell, for a row that breaks a rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_chain.schema import (
    BLOCKS,
    LOGS,
    MAX_INTEGER,
    MAX_UINT256,
    TRACES,
    TRANSACTIONS,
    WITHDRAWALS,
    Block,
    Column,
    ColumnType,
    Log,
    RowError,
    Table,
    Trace,
    Transaction,
    Withdrawal,
    check_value,
    checked_row,
)

ROWS: list[tuple[Table, type[msgspec.Struct]]] = [
    (BLOCKS, Block),
    (TRANSACTIONS, Transaction),
    (LOGS, Log),
    (WITHDRAWALS, Withdrawal),
    (TRACES, Trace),
]

# A few values of each form shared by every row: a hash or an address seen twice
# (checked_row remembers the well-formed ones) in cells where it is and is not valid.
HASH = "0x" + "ab" * 32
ADDRESS = "0x" + "cd" * 20


def _hex(digits: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdefABCDEF", min_size=digits, max_size=digits).map("0x{}".format)


VALUES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.sampled_from([0, 1, 2, MAX_INTEGER, MAX_INTEGER + 1, MAX_UINT256, MAX_UINT256 + 1, -1]),
    st.integers(min_value=-(2**70), max_value=2**260),
    st.booleans(),
    st.sampled_from([HASH, ADDRESS, HASH.upper(), "0x", "0x0", "0xzz", "", "12", "text"]),
    _hex(64),
    _hex(40),
    st.integers(min_value=0, max_value=80).flatmap(_hex),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["[1, 2]", "{}", "[1,"]),
)


def _valid(column: Column) -> st.SearchStrategy[Any]:
    """The values ``column`` stores, in the forms a row may hold them."""
    if column.name == "success":
        well_formed: st.SearchStrategy[Any] = st.sampled_from([0, 1])
    else:
        well_formed = {
            ColumnType.INTEGER: st.integers(0, MAX_INTEGER),
            ColumnType.UINT256: st.one_of(st.integers(0, MAX_UINT256), st.just("12")),
            ColumnType.HASH: st.one_of(st.just(HASH), _hex(64)),
            ColumnType.ADDRESS: st.one_of(st.just(ADDRESS), _hex(40)),
            ColumnType.DATA: st.integers(0, 40).map(lambda n: 2 * n).flatmap(_hex),
            ColumnType.TEXT: st.text(max_size=8),
            ColumnType.JSON: st.lists(st.integers(), max_size=2),
        }[column.type]
    return st.one_of(st.none(), well_formed) if column.nullable else well_formed


def _reference(table: Table, row: msgspec.Struct, where: str) -> tuple[Any, ...]:
    return tuple(
        check_value(table, column, getattr(row, column.name), where) for column in table.columns
    )


def _outcome(check: Any, table: Table, row: msgspec.Struct) -> tuple[str, Any]:
    try:
        return "stored", check(table, row, "block 7")
    except RowError as exc:
        return "refused", str(exc)


@pytest.mark.parametrize(("table", "struct"), ROWS, ids=[t.name for t, _ in ROWS])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_checked_row_stores_and_refuses_as_the_rules_do(
    table: Table, struct: type[msgspec.Struct], data: st.DataObject
) -> None:
    # Mostly well-formed rows (every cell stored), and rows broken at some cells.
    broken = data.draw(st.sets(st.sampled_from([c.name for c in table.columns]), max_size=2))
    values = {
        column.name: data.draw(VALUES if column.name in broken else _valid(column), column.name)
        for column in table.columns
    }
    row = struct(**values)
    for _ in range(2):  # the second time, what it remembered of the first
        assert _outcome(checked_row, table, row) == _outcome(_reference, table, row)


def test_a_well_formed_row_is_stored_with_its_conversions() -> None:
    log = Log(
        block_number=7,
        log_index=0,
        transaction_index=0,
        transaction_hash=HASH,
        block_hash=HASH.upper().replace("0X", "0x"),
        address=ADDRESS,
        topic0=HASH,
        topic1=None,
        topic2=None,
        topic3=None,
        data="0x",
    )
    stored = (7, 0, 0, HASH, HASH, ADDRESS, HASH, None, None, None, "0x")
    assert checked_row(LOGS, log, "block 7") == stored
