"""The block database's schema: one set of tables for SQLite and PostgreSQL.

Rules every row obeys, checked on write (``RowError`` names the column and row):

* hashes, addresses, topics and data are lowercase ``0x`` hex; empty input or
  data is ``"0x"``; absent values are NULL (a contract creation's ``to_address``,
  missing topics, a pre-London ``base_fee_per_gas``);
* ``value``, ``difficulty``, ``total_difficulty`` and the fee columns are uint256
  decimal strings (SQLite TEXT, PostgreSQL NUMERIC(78,0)), because they do not
  fit 64 bits;
* every other number is an INTEGER/BIGINT from 0 to 2**63 - 1; a larger one is
  refused, never truncated;
* ``success`` is 0 or 1;
* ``text`` columns hold a node's words as it gave them (an error, a frame's
  type), at most ``MAX_TEXT`` characters;
* ``json`` columns hold a list or an object as compact JSON text (an access
  list, a transaction's fields the schema has no column for).

The version of the schema is ``PRAGMA user_version`` in SQLite and the one row of
``blockx_schema(version)`` in PostgreSQL; ``MIGRATIONS[i]`` takes a database from
version ``i`` to ``i + 1`` and is applied on open.

Besides the chain's own columns, ``blocks`` holds ``seen_at_ms``: when ingest
stored the block (Unix ms), NULL for a block stored before the column existed.
It is BlockX's bookkeeping, not chain data, so no function-visible read returns
it: a function's output never depends on when its block was ingested.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec


class ColumnType(enum.Enum):
    INTEGER = "integer"  # 0 .. 2**63 - 1
    HASH = "hash"  # 32 bytes
    ADDRESS = "address"  # 20 bytes
    DATA = "data"  # any number of bytes, "0x" when empty
    UINT256 = "uint256"  # a decimal string
    TEXT = "text"  # words, at most MAX_TEXT characters
    JSON = "json"  # a list or an object, as JSON text


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


INT, H, A, D, U, T, J = (
    ColumnType.INTEGER,
    ColumnType.HASH,
    ColumnType.ADDRESS,
    ColumnType.DATA,
    ColumnType.UINT256,
    ColumnType.TEXT,
    ColumnType.JSON,
)

BLOCKS: Final = Table(
    "blocks",
    (
        Column("block_number", INT),
        Column("block_hash", H),
        Column("parent_hash", H),
        Column("timestamp", INT),
        Column("miner", A),
        Column("gas_used", INT),
        Column("gas_limit", INT),
        Column("base_fee_per_gas", INT, nullable=True),
        Column("transaction_count", INT),
        # The rest of the header (schema version 3): NULL where the node's era or
        # chain has no such field, and in rows stored before the columns existed.
        Column("nonce", D, nullable=True),
        Column("mix_hash", H, nullable=True),
        Column("sha3_uncles", H, nullable=True),
        Column("logs_bloom", D, nullable=True),
        Column("transactions_root", H, nullable=True),
        Column("state_root", H, nullable=True),
        Column("receipts_root", H, nullable=True),
        Column("difficulty", U, nullable=True),
        Column("total_difficulty", U, nullable=True),
        Column("size", INT, nullable=True),
        Column("extra_data", D, nullable=True),
        Column("withdrawals_root", H, nullable=True),
        Column("blob_gas_used", INT, nullable=True),
        Column("excess_blob_gas", INT, nullable=True),
        Column("parent_beacon_block_root", H, nullable=True),
        Column("requests_hash", H, nullable=True),
        Column("uncle_count", INT, nullable=True),
    ),
    key=("block_number",),
)
TRANSACTIONS: Final = Table(
    "transactions",
    (
        Column("block_number", INT),
        Column("transaction_index", INT),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("from_address", A),
        Column("to_address", A, nullable=True),
        Column("value", U),
        Column("input", D),
        Column("nonce", INT),
        Column("gas_limit", INT),
        Column("gas_used", INT),
        Column("effective_gas_price", INT, nullable=True),
        Column("transaction_type", INT),
        Column("success", INT, nullable=True),
        Column("contract_address", A, nullable=True),
        # Fees, signature and type-specific fields, then the receipt's (schema
        # version 3): NULL where the transaction's type has no such field.
        Column("gas_price", U, nullable=True),
        Column("max_fee_per_gas", U, nullable=True),
        Column("max_priority_fee_per_gas", U, nullable=True),
        Column("max_fee_per_blob_gas", U, nullable=True),
        Column("blob_versioned_hashes", J, nullable=True),
        Column("chain_id", INT, nullable=True),
        Column("access_list", J, nullable=True),
        Column("authorization_list", J, nullable=True),
        Column("v", INT, nullable=True),
        Column("r", H, nullable=True),
        Column("s", H, nullable=True),
        Column("y_parity", INT, nullable=True),
        Column("cumulative_gas_used", INT, nullable=True),
        Column("receipt_root", H, nullable=True),
        Column("blob_gas_used", INT, nullable=True),
        Column("blob_gas_price", U, nullable=True),
        # The transaction's and its receipt's fields no column holds, as
        # blockx_chain.ingest.rows describes; NULL when every field has one.
        Column("extra", J, nullable=True),
    ),
    key=("block_number", "transaction_index"),
)
LOGS: Final = Table(
    "logs",
    (
        Column("block_number", INT),
        Column("log_index", INT),
        Column("transaction_index", INT),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("address", A),
        Column("topic0", H, nullable=True),
        Column("topic1", H, nullable=True),
        Column("topic2", H, nullable=True),
        Column("topic3", H, nullable=True),
        Column("data", D),
    ),
    key=("block_number", "log_index"),
)
ERC20_TRANSFERS: Final = Table(
    "erc20_transfers",
    (
        Column("block_number", INT),
        Column("log_index", INT),
        Column("transaction_index", INT),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("token", A),
        Column("from_address", A),
        Column("to_address", A),
        Column("value", U),
    ),
    key=("block_number", "log_index"),
)
WITHDRAWALS: Final = Table(
    "withdrawals",
    (
        Column("block_number", INT),
        Column("block_hash", H),
        Column("position", INT),  # in the block's list
        Column("withdrawal_index", INT),  # the consensus layer's counter
        Column("validator_index", INT),
        Column("address", A),
        Column("amount", INT),  # gwei
    ),
    key=("block_number", "position"),
)
CHAIN: Final = Table(
    "chain",
    (
        Column("chain_id", INT),
        Column("genesis_hash", H),
        Column("head_number", INT, nullable=True),
        Column("head_hash", H, nullable=True),
        Column("finalized_number", INT, nullable=True),
        Column("epoch", INT),
    ),
    key=(),
)
REORGS: Final = Table(
    "reorgs",
    (
        Column("id", INT),
        Column("detected_at_ms", INT),
        Column("fork_block_number", INT),
        Column("depth", INT),
        Column("old_head_hash", H),
        Column("new_head_hash", H),
    ),
    key=("id",),
)

# When ingest stored a block: in ``blocks``, after the chain's columns (version 2).
SEEN_AT: Final = Column("seen_at_ms", INT, nullable=True)

# Tables keyed by block: what delete_above removes, what insert_blocks replaces,
# what ``rows`` reads (ordered by the table's key) and what no sink may target. A
# new table with ``block_number`` and ``block_hash`` columns needs only to be
# listed here to be served by io.blockdb and scanned by the Builders.
BLOCK_TABLES: Final = (BLOCKS, TRANSACTIONS, LOGS, ERC20_TRANSFERS, WITHDRAWALS)
TABLES: Final = (*BLOCK_TABLES, CHAIN, REORGS)

INDEXES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("blocks_by_hash", "blocks", ("block_hash",)),
    ("transactions_by_hash", "transactions", ("transaction_hash",)),
    ("logs_by_topic0", "logs", ("topic0", "block_number")),
    ("logs_by_address", "logs", ("address", "block_number")),
    ("erc20_transfers_by_token", "erc20_transfers", ("token", "block_number")),
)
# Made by the migration to version 3, not by version 1 (which makes INDEXES).
WITHDRAWALS_INDEXES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("withdrawals_by_address", "withdrawals", ("address", "block_number")),
    ("withdrawals_by_validator", "withdrawals", ("validator_index", "block_number")),
)

# keccak256("Transfer(address,address,uint256)")
TRANSFER_TOPIC: Final = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


class Engine(enum.Enum):
    SQLITE = "sqlite"
    POSTGRES = "postgresql"


_SQL_TYPES: Final[Mapping[Engine, Mapping[ColumnType, str]]] = {
    Engine.SQLITE: {
        INT: "INTEGER",
        H: "TEXT",
        A: "TEXT",
        D: "TEXT",
        U: "TEXT",
        T: "TEXT",
        J: "TEXT",
    },
    Engine.POSTGRES: {
        INT: "BIGINT",
        H: "TEXT",
        A: "TEXT",
        D: "TEXT",
        U: "NUMERIC(78,0)",
        T: "TEXT",
        J: "TEXT",
    },
}


def create_table(table: Table, engine: Engine) -> str:
    types = _SQL_TYPES[engine]
    lines = []
    for column in table.columns:
        if table.name == REORGS.name and column.name == "id":
            # Ids only grow, even after deletes: followers use them as a cursor.
            lines.append(
                "id INTEGER PRIMARY KEY AUTOINCREMENT"
                if engine is Engine.SQLITE
                else "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
            )
            continue
        null = "" if column.nullable else " NOT NULL"
        lines.append(f"{column.name} {types[column.type]}{null}")
    if table.key and table.name != REORGS.name:
        lines.append(f"PRIMARY KEY ({', '.join(table.key)})")
    return f"CREATE TABLE {table.name} (\n    " + ",\n    ".join(lines) + "\n)"


def create_index(name: str, table: str, columns: tuple[str, ...]) -> str:
    return f"CREATE INDEX {name} ON {table} ({', '.join(columns)})"


# The first version's tables and how many of each one's columns it had: a table
# is made by the migration that adds it, and a later migration appends columns to
# the table's definition above and ALTERs them in, so version 1 stays as it was.
_V1_COLUMNS: Final = {
    BLOCKS.name: 9,
    TRANSACTIONS.name: 15,
    LOGS.name: 11,
    ERC20_TRANSFERS.name: 9,
    CHAIN.name: 6,
    REORGS.name: 6,
}


def _as_of_v1(table: Table) -> Table:
    return Table(table.name, table.columns[: _V1_COLUMNS[table.name]], table.key)


def _schema_v1(engine: Engine) -> list[str]:
    tables = (BLOCKS, TRANSACTIONS, LOGS, ERC20_TRANSFERS, CHAIN, REORGS)
    statements = [create_table(_as_of_v1(table), engine) for table in tables]
    statements += [create_index(name, table, columns) for name, table, columns in INDEXES]
    # The chain table holds one row: a unique index on a constant refuses a second.
    statements.append("CREATE UNIQUE INDEX chain_one_row ON chain ((1))")
    return statements


def _seen_at_v2(engine: Engine) -> list[str]:
    return [f"ALTER TABLE blocks ADD COLUMN {SEEN_AT.name} {_SQL_TYPES[engine][SEEN_AT.type]}"]


def _every_column_v3(engine: Engine) -> list[str]:
    types = _SQL_TYPES[engine]
    statements = [
        f"ALTER TABLE {table.name} ADD COLUMN {column.name} {types[column.type]}"
        for table, columns in (
            (BLOCKS, BLOCKS.columns[9:26]),
            (TRANSACTIONS, TRANSACTIONS.columns[15:32]),
        )
        for column in columns
    ]
    statements.append(create_table(WITHDRAWALS, engine))
    statements += [create_index(*index) for index in WITHDRAWALS_INDEXES]
    return statements


MIGRATIONS: Final = (_schema_v1, _seen_at_v2, _every_column_v3)
SCHEMA_VERSION: Final = len(MIGRATIONS)
# The schema version that added ``blocks.seen_at_ms``.
SEEN_AT_SINCE: Final = MIGRATIONS.index(_seen_at_v2) + 1
# The schema version that added the header, fee and signature columns and withdrawals.
EVERY_COLUMN_SINCE: Final = MIGRATIONS.index(_every_column_v3) + 1

_CREATE_TABLE: Final = re.compile(r"\s*CREATE\s+TABLE\s+(\w+)", re.IGNORECASE)


def created_tables(statements: Sequence[str]) -> list[str]:
    """The tables these migration statements create, by name."""
    return [m.group(1).lower() for s in statements if (m := _CREATE_TABLE.match(s)) is not None]


def refuse_existing_tables(
    statements: Sequence[str], existing: Collection[str], version: int, description: str
) -> None:
    """SchemaError when the migration to ``version`` would create a table the
    database already holds (a user's own table of the same name): the stores call
    this before every migration, so each new table is covered by being created."""
    have = {name.lower() for name in existing}
    for name in created_tables(statements):
        if name in have:
            raise SchemaError(
                f"{description} already holds a table named {name!r}, which BlockX's "
                f"schema version {version} creates: rename or drop that table, then open again"
            )


class SchemaError(Exception):
    """A database cannot take this schema; the stores raise it as SchemaRefused."""


# Rows written by ingest. Field names are the column names.


class Block(msgspec.Struct, frozen=True, kw_only=True):
    block_number: int
    block_hash: str
    parent_hash: str
    timestamp: int
    miner: str
    gas_used: int
    gas_limit: int
    base_fee_per_gas: int | None
    transaction_count: int
    nonce: str | None = None
    mix_hash: str | None = None
    sha3_uncles: str | None = None
    logs_bloom: str | None = None
    transactions_root: str | None = None
    state_root: str | None = None
    receipts_root: str | None = None
    difficulty: int | str | None = None
    total_difficulty: int | str | None = None
    size: int | None = None
    extra_data: str | None = None
    withdrawals_root: str | None = None
    blob_gas_used: int | None = None
    excess_blob_gas: int | None = None
    parent_beacon_block_root: str | None = None
    requests_hash: str | None = None
    uncle_count: int | None = None


class Transaction(msgspec.Struct, frozen=True, kw_only=True):
    block_number: int
    transaction_index: int
    transaction_hash: str
    block_hash: str
    from_address: str
    to_address: str | None
    value: int | str
    input: str
    nonce: int
    gas_limit: int
    gas_used: int
    effective_gas_price: int | None
    transaction_type: int
    success: int | None
    contract_address: str | None
    gas_price: int | str | None = None
    max_fee_per_gas: int | str | None = None
    max_priority_fee_per_gas: int | str | None = None
    max_fee_per_blob_gas: int | str | None = None
    blob_versioned_hashes: list[Any] | str | None = None
    chain_id: int | None = None
    access_list: list[Any] | str | None = None
    authorization_list: list[Any] | str | None = None
    v: int | None = None
    r: str | None = None
    s: str | None = None
    y_parity: int | None = None
    cumulative_gas_used: int | None = None
    receipt_root: str | None = None
    blob_gas_used: int | None = None
    blob_gas_price: int | str | None = None
    extra: dict[str, Any] | str | None = None


class Log(msgspec.Struct, frozen=True, kw_only=True):
    block_number: int
    log_index: int
    transaction_index: int
    transaction_hash: str
    block_hash: str
    address: str
    topic0: str | None
    topic1: str | None
    topic2: str | None
    topic3: str | None
    data: str


class Withdrawal(msgspec.Struct, frozen=True, kw_only=True):
    block_number: int
    block_hash: str
    position: int
    withdrawal_index: int
    validator_index: int
    address: str
    amount: int


class BlockRows(msgspec.Struct, frozen=True, kw_only=True):
    """One block with its transactions, logs and withdrawals, as insert_blocks
    takes it."""

    block: Block
    transactions: Sequence[Transaction] = ()
    logs: Sequence[Log] = ()
    withdrawals: Sequence[Withdrawal] = ()


class ChainState(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: int
    genesis_hash: str
    head_number: int | None
    head_hash: str | None
    finalized_number: int | None
    epoch: int


class RowError(ValueError):
    """A row breaks the schema's rules; nothing of its batch is written."""


MAX_INTEGER: Final = 2**63 - 1
MAX_UINT256: Final = 2**256 - 1
# A node's error text is a sentence; a longer one is refused rather than stored cut.
MAX_TEXT: Final = 4096
_HEX: Final = re.compile(r"0x(?:[0-9a-f]{2})*")
_HEX_LENGTH: Final[Mapping[ColumnType, int]] = {H: 66, A: 42}


def check_value(table: Table, column: Column, value: Any, where: str) -> Any:
    """``value`` as stored in ``column``; RowError when it breaks the column's rule."""
    name = f"{table.name}.{column.name} of {where}"
    if value is None:
        if column.nullable:
            return None
        raise RowError(f"{name} is NULL, and the column is NOT NULL")
    match column.type:
        case ColumnType.INTEGER:
            if not isinstance(value, int) or isinstance(value, bool):
                raise RowError(f"{name} must be an integer, got {value!r}")
            if not 0 <= value <= MAX_INTEGER:
                raise RowError(f"{name} does not fit 63 bits: {value}")
            if column.name == "success" and value not in (0, 1):
                raise RowError(f"{name} must be 0 or 1, got {value}")
            return value
        case ColumnType.UINT256:
            return uint256_text(value, name)
        case ColumnType.TEXT:
            if not isinstance(value, str):
                raise RowError(f"{name} must be text, got {value!r}")
            if len(value) > MAX_TEXT:
                raise RowError(f"{name} is longer than {MAX_TEXT} characters")
            return value
        case ColumnType.JSON:
            return json_text(value, name)
        case ColumnType.HASH | ColumnType.ADDRESS | ColumnType.DATA:
            if not isinstance(value, str):
                raise RowError(f"{name} must be 0x hex text, got {value!r}")
            lowered = value.lower()
            if _HEX.fullmatch(lowered) is None:
                raise RowError(f"{name} must be 0x hex with whole bytes, got {value!r}")
            length = _HEX_LENGTH.get(column.type)
            if length is not None and len(lowered) != length:
                raise RowError(f"{name} must be {(length - 2) // 2} bytes, got {value!r}")
            return lowered


def uint256_text(value: Any, name: str) -> str:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise RowError(f"{name} must be a uint256 (an int or a decimal string), got {value!r}")
    if not 0 <= number <= MAX_UINT256:
        raise RowError(f"{name} is no uint256: {number}")
    return str(number)


def json_text(value: Any, name: str) -> str:
    """``value`` (a list or an object, or its JSON text) as compact JSON text."""
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            raise RowError(f"{name} must be JSON text, got {value[:80]!r}") from None
    if not isinstance(value, list | dict):
        raise RowError(f"{name} must be a JSON list or object, got {value!r}")
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError) as e:
        raise RowError(f"{name} cannot be JSON: {e}") from None


_EXACT_HEX: Final[Mapping[ColumnType, re.Pattern[str]]] = {
    H: re.compile(r"0x[0-9a-f]{64}"),
    A: re.compile(r"0x[0-9a-f]{40}"),
    D: _HEX,
}


# How checked_row takes a column's common case inline, without check_value (plain
# ints: the loop compares them with literals, the cheapest test there is).
_FAST_NONE: Final = 0  # every value goes through check_value
_FAST_INTEGER: Final = 1  # an int in 0 .. 2**63 - 1
_FAST_HEX: Final = 2  # lowercase hex of the column's length
_FAST_UINT256: Final = 3  # an int in 0 .. 2**256 - 1, stored as its decimal text
_FAST_JSON: Final = 4  # a list or an object, stored as compact JSON text


class _Plan:
    """A table's columns as checked_row walks them, worked out once per table."""

    __slots__ = ("steps", "table")

    def __init__(self, table: Table) -> None:
        self.table = table
        self.steps = tuple((column, *_fast_way(column)) for column in table.columns)


def _fast_way(column: Column) -> tuple[bool, int, re.Pattern[str]]:
    if column.type is ColumnType.INTEGER and column.name != "success":
        fast = _FAST_INTEGER
    elif column.type in _EXACT_HEX:
        return column.nullable, _FAST_HEX, _EXACT_HEX[column.type]
    elif column.type is ColumnType.UINT256:
        fast = _FAST_UINT256
    elif column.type is ColumnType.JSON:
        fast = _FAST_JSON
    else:
        fast = _FAST_NONE
    return column.nullable, fast, _HEX  # the pattern is only used with _FAST_HEX


_PLANS: Final[dict[str, _Plan]] = {}


def checked_row(table: Table, row: msgspec.Struct, where: str) -> tuple[Any, ...]:
    """``row``'s values in ``table``'s column order, each checked.

    The common case (NULL where allowed, an in-range int, lowercase hex of the
    right length, a list or an object) is accepted inline; anything else goes
    through check_value, which converts it (uppercase hex, a uint256 in text) or
    raises with the rule it broke. Ingest checks every cell of every row, so this
    is on its hot path."""
    plan = _PLANS.get(table.name)
    if plan is None or plan.table is not table:
        plan = _PLANS[table.name] = _Plan(table)
    out: list[Any] = []
    append = out.append
    for (column, nullable, fast, pattern), value in zip(
        plan.steps, msgspec.structs.astuple(row), strict=True
    ):
        if value is None:
            if nullable:
                append(None)
                continue
        elif fast == 1:
            if type(value) is int and 0 <= value <= 0x7FFFFFFFFFFFFFFF:
                append(value)
                continue
        elif fast == 2:
            if type(value) is str and pattern.fullmatch(value) is not None:
                append(value)
                continue
        elif fast == 3:
            if type(value) is int and 0 <= value <= MAX_UINT256:
                append(str(value))
                continue
        elif fast == 4 and type(value) in (list, dict):
            append(json_text(value, f"{table.name}.{column.name} of {where}"))
            continue
        append(check_value(table, column, value, where))
    return tuple(out)


# checked_row's loop writes these out.
assert (MAX_INTEGER, _FAST_INTEGER, _FAST_HEX, _FAST_UINT256, _FAST_JSON) == (
    0x7FFFFFFFFFFFFFFF,
    1,
    2,
    3,
    4,
)


def erc20_transfer(log: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The erc20_transfers row of a checked logs row, or None when the log is no
    ERC-20 Transfer (topic0 Transfer, three topics, 32 bytes of data: ERC-721 has a
    fourth topic and no data)."""
    (number, log_index, tx_index, tx_hash, block_hash, address, t0, t1, t2, t3, data) = log
    if t0 != TRANSFER_TOPIC or t1 is None or t2 is None or t3 is not None or len(data) != 66:
        return None
    return (
        number,
        log_index,
        tx_index,
        tx_hash,
        block_hash,
        address,
        "0x" + t1[-40:],
        "0x" + t2[-40:],
        str(int(data, 16)),
    )


def block_row_sets(
    blocks: Sequence[BlockRows],
) -> dict[str, list[tuple[Any, ...]]]:
    """The checked rows of every block table for ``blocks``, erc20_transfers derived
    from the logs; RowError on the first row that breaks a rule, or on a transaction
    or log whose block_number is not its block's."""
    rows: dict[str, list[tuple[Any, ...]]] = {t.name: [] for t in BLOCK_TABLES}
    for bundle in blocks:
        number = bundle.block.block_number
        rows[BLOCKS.name].append(checked_row(BLOCKS, bundle.block, f"block {number}"))
        for tx in bundle.transactions:
            where = f"block {number} transaction {tx.transaction_index}"
            if tx.block_number != number:
                raise RowError(f"{where} says block_number {tx.block_number}")
            rows[TRANSACTIONS.name].append(checked_row(TRANSACTIONS, tx, where))
        for log in bundle.logs:
            where = f"block {number} log {log.log_index}"
            if log.block_number != number:
                raise RowError(f"{where} says block_number {log.block_number}")
            checked = checked_row(LOGS, log, where)
            rows[LOGS.name].append(checked)
            transfer = erc20_transfer(checked)
            if transfer is not None:
                rows[ERC20_TRANSFERS.name].append(transfer)
        for withdrawal in bundle.withdrawals:
            where = f"block {number} withdrawal {withdrawal.position}"
            if withdrawal.block_number != number:
                raise RowError(f"{where} says block_number {withdrawal.block_number}")
            rows[WITHDRAWALS.name].append(checked_row(WITHDRAWALS, withdrawal, where))
    return rows


for _table, _struct in (
    (BLOCKS, Block),
    (TRANSACTIONS, Transaction),
    (LOGS, Log),
    (WITHDRAWALS, Withdrawal),
):
    # checked_row reads a row's fields in order: they are the table's columns.
    assert _struct.__struct_fields__ == _table.names, _table.name


def chain_row(values: Mapping[str, Any]) -> ChainState:
    return msgspec.convert(dict(values), ChainState)
