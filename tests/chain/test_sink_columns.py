"""A sink table's columns on both engines: widened when a value needs it (INTEGER to
NUMERIC, once, logged), never narrowed; a change that is no widening, a NUMERIC
value that is no plain decimal, columns differing only by case, too many columns
and a name that is taken are refused, not retryable, before anything is written;
a statement the database refuses as such is not retryable either; and the writers'
own names (indexes included) never collide with a table a user names."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sink_layouts import make_sink_at

from blockx_chain.sink import SinkError, SinkRejected, SinkStore, open_sink
from blockx_chain.sink.schema import index_name
from blockx_chain.url import parse_blockdb_url

BIG = 10**27
KEY = ["block_number", "row_index"]


def volumes(rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(r["block_number"], r["volume"]) for r in rows]


async def test_an_integer_column_widens_to_numeric_once_and_is_never_narrowed(
    sink: SinkStore, caplog: pytest.LogCaptureFixture
) -> None:
    # follow makes the column INTEGER from small values; a backfill of earlier
    # blocks then brings a value beyond 64 bits.
    await sink.replace_blocks("vol", 1, [(5, "0x5", [{"volume": 7}, {"volume": None}])])
    with caplog.at_level(logging.WARNING, logger="blockx_chain.sink"):
        await sink.replace_blocks("vol", 1, [(1, "0x1", [{"volume": BIG}]), (2, "0x2", [])])
        await sink.replace_blocks("vol", 1, [(3, "0x3", [{"volume": -BIG}, {"volume": 3}])])
    assert volumes(await sink.rows("vol")) == [
        (1, str(BIG)),
        (3, str(-BIG)),
        (3, "3"),
        (5, "7"),
        (5, None),
    ]
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "widened column 'volume' of table 'vol' from INTEGER to NUMERIC (the table was rewritten)"
    ]
    # The table kept its unique key through the rewrite: a block rewritten is
    # replaced, a duplicate key refused.
    await sink.replace_blocks("vol", 1, [(5, "0x5b", [{"volume": 8}])])
    assert volumes(await sink.rows("vol"))[-1] == (5, "8")
    twice = [{"volume": 1, "row_index": 0}, {"volume": 2, "row_index": 0}]
    with pytest.raises(SinkRejected, match="do not fit"):
        await sink.replace_blocks("vol", 1, [(6, "0x6", twice)], key=KEY)
    # Declared narrower than recorded: the column stays NUMERIC.
    narrower = {"volume": "INTEGER"}
    await sink.replace_blocks("vol", 1, [(7, "0x7", [{"volume": 1}])], columns=narrower)
    assert volumes(await sink.rows("vol"))[-1] == (7, "1")

    # A declared widening widens; an upsert widens as a block write does.
    await sink.replace_blocks("declared", 1, [(1, "0x1", [{"volume": 7}])])
    await sink.replace_blocks(
        "declared", 1, [(2, "0x2", [{"volume": 8}])], columns={"volume": "NUMERIC"}
    )
    assert volumes(await sink.rows("declared")) == [(1, "7"), (2, "8")]
    await sink.upsert("totals", [{"who": "a", "n": 1}], key=["who"])
    await sink.upsert("totals", [{"who": "b", "n": BIG}], key=["who"])
    assert sorted((r["who"], r["n"]) for r in await sink.rows("totals")) == [
        ("a", "1"),
        ("b", str(BIG)),
    ]


# (declared columns, the new row's volume, what the refusal says)
NO_WIDENING: list[tuple[dict[str, str] | None, Any, str]] = [
    (
        None,
        1.5,
        "column 'volume' of table 'vol' is INTEGER: the value 1.5 does not fit, it is REAL: a "
        "column's type only ever widens .*: give the column its type before its table's first "
        r"write \(--column volume=REAL on blockx backfill or follow, "
        r"writer_config=\{'columns': \{'volume': 'REAL'\}\} "
        "in the Python API\\)",
    ),
    (
        {"volume": "TEXT"},
        None,
        "column 'volume' of table 'vol' is INTEGER, the writer declares TEXT, which is no "
        "widening of INTEGER.*--column volume=TEXT",
    ),
    (
        {"volume": "INTEGER"},
        BIG,
        "the value 1000000000000000000000000000 does not fit, it is NUMERIC: declare it NUMERIC, "
        "which widens it: --column volume=NUMERIC",
    ),
    # SQLite's "duplicate column name"; PostgreSQL would make a second column.
    ({"Volume": "INTEGER"}, 2, "columns 'volume' and 'Volume' of table 'vol' differ only by case"),
]


async def test_a_widening_under_a_users_view(sink: SinkStore, db_url: str) -> None:
    await sink.replace_blocks("viewed", 1, [(1, "0x1", [{"volume": 7}])])
    async with sink.transaction() as tx:
        await tx.execute('CREATE VIEW volumes AS SELECT volume FROM "viewed"')
    big = [(2, "0x2", [{"volume": BIG}])]
    if db_url.startswith("postgresql"):
        # PostgreSQL does not change the type of a column a view depends on.
        with pytest.raises(SinkRejected, match="'volume' of table 'viewed' cannot be widened "):
            await sink.replace_blocks("viewed", 1, big)
        assert [w["block_number"] for w in await sink.written("viewed", 1)] == [1]
        return
    # SQLite rewrites the table under the same name: the view still reads it.
    await sink.replace_blocks("viewed", 1, big)
    async with sink.transaction() as tx:
        assert await tx.fetch("SELECT volume FROM volumes", ()) == [
            {"volume": "7"},
            {"volume": str(BIG)},
        ]


async def test_a_change_that_is_no_widening_names_the_column_the_types_and_the_flag(
    sink: SinkStore,
) -> None:
    await sink.replace_blocks("vol", 1, [(1, "0x1", [{"volume": 7}])])
    before = await sink.rows("vol")
    for columns, value, message in NO_WIDENING:
        with pytest.raises(SinkRejected, match=message):
            await sink.replace_blocks("vol", 1, [(2, "0x2", [{"volume": value}])], columns=columns)
    assert await sink.rows("vol") == before
    assert [w["block_number"] for w in await sink.written("vol", 1)] == [1]


# Decimal text of any length costs memory and disk in proportion to its exponent,
# not its size: each of these is refused, in a NUMERIC column of either engine.
NOT_PLAIN: list[Any] = [
    "1e100000000",
    "1e99999999999999999",
    "1E5",
    "NaN",
    "Infinity",
    " 5",
    "1_000",
    "\u0663",  # an Arabic-Indic digit three: Decimal takes it
    "1" * 79,
    "0." + "1" * 79,
    10**78,
    -(10**78),
    1e100,
]
WIDEST: list[Any] = ["9" * 78, "-" + "9" * 78, "0." + "9" * 78, "+12.50", "-.5", "7.", 10**78 - 1]


async def test_a_numeric_value_is_a_plain_decimal_of_at_most_78_digits_each_side(
    sink: SinkStore,
) -> None:
    await sink.replace_blocks("amounts", 1, [(1, "0x1", [{"amount": BIG}])])
    for value in NOT_PLAIN:
        with pytest.raises(
            SinkRejected, match=r"column 'amount' of table 'amounts' is NUMERIC.*plain decimal"
        ):
            await sink.replace_blocks("amounts", 1, [(2, "0x2", [{"amount": value}])])
    assert [w["block_number"] for w in await sink.written("amounts", 1)] == [1]
    await sink.replace_blocks("amounts", 1, [(2, "0x2", [{"amount": v} for v in WIDEST])])
    stored = [r["amount"] for r in await sink.rows("amounts")][1:]
    assert [float(v) for v in stored] == [float(v) for v in WIDEST]
    assert (stored[0], stored[2], stored[-1]) == ("9" * 78, "0." + "9" * 78, str(10**78 - 1))


async def test_columns_the_database_would_refuse_are_refused_before_it(
    sink: SinkStore, db_url: str
) -> None:
    # The first write to a new sink: refused, it leaves the sink usable.
    limit = 1600 if db_url.startswith("postgresql") else 2000
    row = {f"c{i}": i for i in range(limit)}  # and the five columns the writer stamps
    with pytest.raises(SinkRejected, match=rf"would have {limit + 5} columns.*allows \({limit}\)"):
        await sink.replace_blocks("wide", 1, [(1, "0x1", [row])])
    with pytest.raises(SinkRejected, match="columns 'k' and 'K' of table 'u' differ only by case"):
        await sink.upsert("u", [{"k": 1, "K": 2}], key=["k"])
    assert await sink.written("wide", 1) == []
    assert await sink.rows("u") == []
    await sink.upsert("u", [{"k": 1}], key=["k"])
    assert await sink.rows("u") == [{"k": 1}]


async def test_a_name_that_is_taken_is_refused_and_the_writers_names_are_their_own(
    sink: SinkStore,
) -> None:
    await sink.replace_blocks("volume", 1, [(1, "0x1", [{"v": 1}])])
    with pytest.raises(SinkRejected, match="'Volume' differs only by case from the sink's table"):
        await sink.replace_blocks("Volume", 1, [(1, "0x1", [{"v": 1}])])
    async with sink.transaction() as tx:
        await tx.execute("CREATE TABLE handmade (x INTEGER)")
    with pytest.raises(SinkRejected, match="already has a table named 'handmade'"):
        await sink.upsert("handmade", [{"x": 1}], key=["x"])
    # The name the writers gave the unique index of "volume" until it moved under
    # "_blockx_" is a table name like any other.
    legacy = index_name("ux", "volume", KEY, legacy=True)
    await sink.replace_blocks(legacy, 1, [(1, "0x1", [{"v": 2}])])
    assert [r["v"] for r in await sink.rows(legacy)] == [2]


async def test_the_index_names_of_an_older_sink_are_moved_under_blockx(db_url: str) -> None:
    legacy = index_name("ux", "volume", KEY, legacy=True)
    # As an older BlockX left it: the index under its old name, no layout version.
    await make_sink_at(db_url, 0, [(1, "0x1", [1])])
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        await sink.replace_blocks(legacy, 1, [(1, "0x1", [{"v": 2}])], claim_unmarked=True)
        async with sink.transaction() as tx:
            assert await tx.legacy_indexes() == []
        # The renamed index still keeps "volume"'s key unique.
        twice = [{"v": 1, "row_index": 0}, {"v": 2, "row_index": 0}]
        with pytest.raises(SinkRejected, match="do not fit"):
            await sink.replace_blocks("volume", 1, [(2, "0x2", twice)], key=KEY)
        await sink.replace_blocks("volume", 1, [(1, "0x1b", [{"v": 3}])])
        assert [(r["block_hash"], r["v"]) for r in await sink.rows("volume")] == [("0x1b", 3)]
    finally:
        await sink.close()


async def test_a_statement_the_database_refuses_as_such_is_not_retryable(
    sink: SinkStore,
) -> None:
    await sink.replace_blocks("gone", 1, [(1, "0x1", [{"v": 1}])])
    async with sink.transaction() as tx:
        await tx.execute('DROP TABLE "gone"')  # behind the writers' back
    with pytest.raises(SinkError) as refused:
        await sink.replace_blocks("gone", 1, [(2, "0x2", [{"v": 1}])])
    assert isinstance(refused.value, SinkRejected), refused.value
    assert not refused.value.retryable
    assert "refuses the write" in str(refused.value)
