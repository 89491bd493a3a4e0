"""The schema's value rules for text and JSON columns, without a database."""

from __future__ import annotations

import pytest

from blockx_chain.schema import MAX_TEXT, Column, ColumnType, RowError, Table, check_value

TABLE = Table(
    "frames",
    (
        Column("error", ColumnType.TEXT, nullable=True),
        Column("access_list", ColumnType.JSON),
    ),
    key=(),
)
ERROR, ACCESS_LIST = TABLE.columns


@pytest.mark.parametrize(
    ("column", "value", "stored"),
    [
        (ERROR, "execution reverted", "execution reverted"),
        (ERROR, "", ""),
        (ERROR, None, None),
        (ERROR, "x" * MAX_TEXT, "x" * MAX_TEXT),
        (ACCESS_LIST, [], "[]"),
        (
            ACCESS_LIST,
            [{"address": "0xab", "storageKeys": []}],
            '[{"address":"0xab","storageKeys":[]}]',
        ),
        (ACCESS_LIST, {"sourceHash": "0x01", "mint": "0x0"}, '{"sourceHash":"0x01","mint":"0x0"}'),
        (ACCESS_LIST, '[ 1, {"a": 2} ]', '[1,{"a":2}]'),
    ],
)
def test_text_and_json_values_are_stored_as_given(
    column: Column, value: object, stored: object
) -> None:
    assert check_value(TABLE, column, value, "row 1") == stored


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (ERROR, 5, "frames.error of row 1 must be text, got 5"),
        (ERROR, "x" * (MAX_TEXT + 1), f"is longer than {MAX_TEXT} characters"),
        (ACCESS_LIST, None, "is NULL, and the column is NOT NULL"),
        (ACCESS_LIST, "[1,", "must be JSON text"),
        (ACCESS_LIST, 7, "must be a JSON list or object, got 7"),
        (ACCESS_LIST, '"a string"', "must be a JSON list or object"),
        (ACCESS_LIST, [object()], "cannot be JSON"),
    ],
)
def test_a_value_that_breaks_a_text_or_json_rule_is_refused(
    column: Column, value: object, message: str
) -> None:
    with pytest.raises(RowError, match=message):
        check_value(TABLE, column, value, "row 1")
