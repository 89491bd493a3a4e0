"""The function-visible reads, as SQL shared by both engines.

Each read checks its arguments (TypeError/ValueError for ones it cannot use),
orders rows by block then index, and asks for one row more than the store's limit
so that a range too wide fails with TooManyRows instead of answering in part.
SQL uses ``?`` placeholders; the PostgreSQL store numbers them.

A reader of a database one migration behind (a SQLite file its ingest has yet to
migrate) passes ``have``, the columns each table holds: a column the file lacks
reads as NULL, as it would after the migration, and a table it lacks is
StoreUnavailable until ingest makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from blockx_chain.schema import (
    BLOCK_TABLES,
    BLOCKS,
    ERC20_TRANSFERS,
    LOGS,
    MAX_INTEGER,
    TRANSACTIONS,
    ColumnType,
    Table,
    check_value,
)
from blockx_chain.store.errors import StoreUnavailable, TooManyRows

DEFAULT_MAX_ROWS: Final = 100_000

# The columns each table of an older database holds; None: the current schema.
Layout = Mapping[str, frozenset[str]] | None


class Read:
    """One SELECT: ``sql`` with ``params``; ``limit`` the rows allowed (the SQL asks
    for one more), ``what`` the call as the caller wrote it, for errors."""

    __slots__ = ("limit", "params", "sql", "what")

    def __init__(self, sql: str, params: tuple[Any, ...], limit: int | None, what: str) -> None:
        self.sql = sql
        self.params = params
        self.limit = limit
        self.what = what

    def check(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.limit is not None and len(rows) > self.limit:
            raise too_many(self.what, self.limit)
        return rows


def too_many(what: str, limit: int) -> TooManyRows:
    return TooManyRows(
        f"{what} would return more than {limit} rows (BLOCKDB_MAX_ROWS): narrow the range"
    )


def block_number(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be a block number (int), got {value!r}")
    if not 0 <= value <= MAX_INTEGER:
        raise ValueError(f"{name} must be from 0 to 2**63 - 1, got {value}")
    return value


def block_range(from_block: Any, to_block: Any) -> tuple[int, int]:
    """``(from, to)`` inclusive; ``to_block=None`` means ``from_block`` alone."""
    start = block_number(from_block, "from_block")
    end = start if to_block is None else block_number(to_block, "to_block")
    if end < start:
        raise ValueError(f"to_block ({end}) is below from_block ({start})")
    return start, end


def hex_filter(value: Any, name: str, length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be 0x hex text, got {value!r}")
    lowered = value.lower()
    digits = lowered[2:]
    if (
        not lowered.startswith("0x")
        or len(lowered) != length
        or any(c not in "0123456789abcdef" for c in digits)
    ):
        raise ValueError(f"{name} must be {(length - 2) // 2} bytes of 0x hex, got {value!r}")
    return lowered


def _select(table: Table, have: Layout) -> str:
    if have is None:
        return f"SELECT {', '.join(table.names)} FROM {table.name}"
    present = have.get(table.name)
    if present is None:
        raise StoreUnavailable(
            f"the block database has no table {table.name} yet: the next ingest adds it"
        )
    names = (n if n in present else f"NULL AS {n}" for n in table.names)
    return f"SELECT {', '.join(names)} FROM {table.name}"


HEAD_SQL: Final = "SELECT head_number, head_hash, finalized_number FROM chain"
CHAIN_SQL: Final = (
    "SELECT chain_id, genesis_hash, head_number, head_hash, finalized_number, epoch FROM chain"
)
REORGS_SQL: Final = (
    "SELECT id, detected_at_ms, fork_block_number, depth, old_head_hash, new_head_hash "
    "FROM reorgs WHERE id > ? ORDER BY id LIMIT ?"
)


def block(number: Any, have: Layout = None) -> Read:
    n = block_number(number, "number")
    return Read(f"{_select(BLOCKS, have)} WHERE block_number = ?", (n,), None, f"block({n})")


def _block_rows(op: str, columns: str, from_block: Any, to_block: Any, max_rows: int) -> Read:
    """``columns`` of the blocks of a range, in block order; a range of more blocks
    than ``max_rows`` is refused before any query."""
    start = block_number(from_block, "from_block")
    end = block_number(to_block, "to_block")
    if end < start:
        raise ValueError(f"to_block ({end}) is below from_block ({start})")
    what = f"{op}({start}, {end})"
    if end - start + 1 > max_rows:
        raise too_many(what, max_rows)
    sql = f"{columns} WHERE block_number BETWEEN ? AND ? ORDER BY block_number"
    return Read(sql, (start, end), max_rows, what)


def blocks(from_block: Any, to_block: Any, max_rows: int, have: Layout = None) -> Read:
    return _block_rows("blocks", _select(BLOCKS, have), from_block, to_block, max_rows)


def hashes(from_block: Any, to_block: Any, max_rows: int) -> Read:
    """The number and hash of each stored block of a range, the way ``blocks`` reads
    its rows."""
    columns = "SELECT block_number, block_hash FROM blocks"
    return _block_rows("hashes", columns, from_block, to_block, max_rows)


def transactions(number: Any, max_rows: int, have: Layout = None) -> Read:
    n = block_number(number, "block_number")
    sql = f"{_select(TRANSACTIONS, have)} WHERE block_number = ? ORDER BY transaction_index LIMIT ?"
    return Read(sql, (n, max_rows + 1), max_rows, f"transactions({n})")


def logs(
    from_block: Any, to_block: Any, address: Any, topic0: Any, max_rows: int, have: Layout = None
) -> Read:
    start, end = block_range(from_block, to_block)
    filters = {
        "address": hex_filter(address, "address", 42),
        "topic0": hex_filter(topic0, "topic0", 66),
    }
    return _ranged(LOGS, start, end, filters, max_rows, "logs", have)


def erc20_transfers(
    from_block: Any, to_block: Any, token: Any, max_rows: int, have: Layout = None
) -> Read:
    start, end = block_range(from_block, to_block)
    filters = {"token": hex_filter(token, "token", 42)}
    return _ranged(ERC20_TRANSFERS, start, end, filters, max_rows, "erc20_transfers", have)


def _ranged(
    table: Table,
    start: int,
    end: int,
    filters: dict[str, str | None],
    max_rows: int,
    op: str,
    have: Layout,
) -> Read:
    where = ["block_number BETWEEN ? AND ?"]
    params: list[Any] = [start, end]
    shown = [str(start), str(end)]
    for column, value in filters.items():
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
            shown.append(f"{column}={value!r}")
    params.append(max_rows + 1)
    order = "ORDER BY block_number, log_index LIMIT ?"
    sql = f"{_select(table, have)} WHERE {' AND '.join(where)} {order}"
    return Read(sql, tuple(params), max_rows, f"{op}({', '.join(shown)})")


# The tables ``rows`` reads: every block table, each ordered by its key (block
# number first). A table added to BLOCK_TABLES is read here with nothing more.
ROW_TABLES: Final = {t.name: t for t in BLOCK_TABLES}


def rows(
    table: Any, from_block: Any, to_block: Any, where: Any, max_rows: int, have: Layout = None
) -> Read:
    """Rows of one chain table in a block range whose columns equal ``where``'s
    values, ordered by the table's key. Column names are checked against the
    schema and values against the column's rule; only ``?`` parameters reach the
    SQL. A UINT256 column cannot be filtered on (its stored form differs between
    the engines)."""
    if not isinstance(table, str) or table not in ROW_TABLES:
        raise ValueError(f"table must be one of {', '.join(ROW_TABLES)}, got {table!r}")
    schema = ROW_TABLES[table]
    start, end = block_range(from_block, to_block)
    if where is None:
        where = {}
    if not isinstance(where, dict):
        raise TypeError(f"where must be an object of column: value, got {where!r}")
    columns = {c.name: c for c in schema.columns}
    clauses = ["block_number BETWEEN ? AND ?"]
    params: list[Any] = [start, end]
    shown = [str(start), str(end)]
    for name, value in sorted(where.items()):
        column = columns.get(name) if isinstance(name, str) else None
        if column is None:
            raise ValueError(f"{table} has no column {name!r} (columns: {', '.join(schema.names)})")
        if column.type is ColumnType.UINT256:
            raise ValueError(f"{table}.{name} holds 256-bit numbers and cannot be filtered on")
        checked = None if value is None else check_value(schema, column, value, "where")
        if have is not None and name not in have.get(table, ()):
            # A column the file lacks yet is NULL in every row.
            clauses.append("1 = 1" if value is None else "1 = 0")
        elif value is None:
            clauses.append(f"{name} IS NULL")
        else:
            clauses.append(f"{name} = ?")
            params.append(checked)
        shown.append(f"{name}={value!r}")
    params.append(max_rows + 1)
    order = ", ".join(schema.key)
    sql = f"{_select(schema, have)} WHERE {' AND '.join(clauses)} ORDER BY {order} LIMIT ?"
    return Read(sql, tuple(params), max_rows, f"rows({table}, {', '.join(shown)})")
