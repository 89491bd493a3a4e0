"""The sink's column-at-a-time conversion gives what ``cell`` gives value by value,
and on a value that does not fit raises the error of the first row that does not fit."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from blockx_chain.sink.encode import encode_rows
from blockx_chain.sink.errors import SinkRejected
from blockx_chain.sink.schema import SinkType, cell

INT, T, R, N, J = SinkType.INTEGER, SinkType.TEXT, SinkType.REAL, SinkType.NUMERIC, SinkType.JSON
BIG = 2**70 + 1

CASES: list[tuple[SinkType, list[Any]]] = [
    (INT, [1, None, -(2**63), 2**63 - 1]),
    (INT, [True, 2]),  # bool is an int: stored as 1
    (T, ["a", None, ""]),
    (R, [1.5, None, 2]),  # an int into REAL becomes a float
    (R, [0.25]),
    (N, [BIG, -BIG, None, 0]),
    (N, ["1.50", 3, 1.5]),
    (J, [{"x": [1]}, None, [1, 2], "s"]),
]


@pytest.mark.parametrize("postgres", [False, True])
@pytest.mark.parametrize(("kind", "values"), CASES)
def test_a_column_converts_as_cell_does(kind: SinkType, values: list[Any], postgres: bool) -> None:
    rows = encode_rows("t", [kind], ["c"], [values], [], postgres)
    expected = [(cell("t", "c", kind, v, postgres),) for v in values]
    assert rows == expected
    assert [type(r[0]) for r in rows] == [type(e[0]) for e in expected]


def test_numeric_stays_exact() -> None:
    assert encode_rows("t", [N], ["v"], [[BIG]], [], False) == [(str(BIG),)]
    assert encode_rows("t", [N], ["v"], [[BIG]], [], True) == [(Decimal(BIG),)]


@pytest.mark.parametrize(
    ("kinds", "columns", "key", "message"),
    [
        # The first row that does not fit is named, whichever column comes first.
        # (the columns: a, b; row 1 is ("a", "x"), row 2 is (1, 2)).
        ([T, INT], [["a", 1], ["x", 2]], [], "column 'b' of table 't' is INTEGER: the value 'x'"),
        ([T, INT], [["a", 1], ["b", "x"]], [], "column 'b'"),
        ([INT], [[2**63]], [], "column 'a' of table 't' is INTEGER"),
        ([R], [[True]], [], "column 'a' of table 't' is REAL"),
        ([N], [["nope"]], [], "column 'a' of table 't' is NUMERIC"),
        # Beyond a float's range: refused, not an OverflowError.
        ([R], [[10**400]], [], "column 'a' of table 't' is REAL: the value 1000"),
        # NUMERIC takes plain decimals of at most 78 digits each side of the point.
        ([N], [["1e100000000"]], [], "NUMERIC: the value '1e100000000' .* plain decimal"),
        ([N], [[1, 10**78]], [], "NUMERIC: the value 1000.* plain decimal"),
        ([N], [[1e-100]], [], "NUMERIC: the value 1e-100 .* plain decimal"),
        ([T, INT], [["a", None], ["x", 2]], ["a"], "column 'b' of table 't' is INTEGER"),
        ([T, INT], [[None, "a"], [1, 2]], ["a"], "no key column 'a'"),
        ([T], [["a"]], ["a", "id"], "no key column 'id'"),
    ],
)
def test_a_value_that_does_not_fit_is_named(
    kinds: list[SinkType], columns: list[list[Any]], key: list[str], message: str
) -> None:
    names = ["a", "b"][: len(kinds)]
    with pytest.raises(SinkRejected, match=message):
        encode_rows("t", kinds, names, columns, key, False)
