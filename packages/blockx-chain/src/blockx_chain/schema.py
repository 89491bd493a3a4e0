"""The block database's schema: one set of tables for SQLite and PostgreSQL.

Rules every row obeys, checked on write (``RowError`` names the column and row):

* hashes, addresses, topics and data are lowercase ``0x`` hex; empty input or
  data is ``"0x"``; absent values are NULL (a contract creation's ``to_address``,
  missing topics, a pre-London ``base_fee_per_gas``);
* ``value``, ``token_id``, ``amount``, ``difficulty``, ``total_difficulty`` and
  the fee columns are uint256 decimal strings (SQLite TEXT, PostgreSQL
  NUMERIC(78,0)), because they do not fit 64 bits;
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
from collections.abc import Callable, Collection, Mapping, Sequence
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
NFT_TRANSFERS: Final = Table(
    "nft_transfers",
    (
        Column("block_number", INT),
        Column("log_index", INT),
        Column("batch_position", INT),
        Column("transaction_index", INT),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("standard", T),
        Column("token", A),
        Column("operator", A, nullable=True),
        Column("from_address", A),
        Column("to_address", A),
        Column("token_id", U),
        Column("amount", U),
    ),
    key=("block_number", "log_index", "batch_position"),
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

# One row per call frame, in the order a depth-first walk of each transaction's
# call tree meets them (``trace_index`` 0 is the transaction's own frame).
TRACES: Final = Table(
    "traces",
    (
        Column("block_number", INT),
        Column("transaction_index", INT),
        Column("trace_index", INT),
        Column("trace_address", J),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("type", T),
        Column("from_address", A),
        Column("to_address", A, nullable=True),
        Column("value", U),
        Column("input", D),
        Column("output", D),
        Column("gas", INT),
        Column("gas_used", INT),
        Column("error", T, nullable=True),
        Column("subtraces", INT),
    ),
    key=("block_number", "transaction_index", "trace_index"),
)
# Every contract a block created: by a transaction (``trace_index`` 0, from the
# receipt) or inside one (a create or create2 frame, with traces).
CONTRACTS: Final = Table(
    "contracts",
    (
        Column("block_number", INT),
        Column("transaction_index", INT),
        Column("trace_index", INT),
        Column("trace_address", J),
        Column("transaction_hash", H),
        Column("block_hash", H),
        Column("address", A),
        Column("creator", A),
        Column("kind", T),
    ),
    key=("block_number", "transaction_index", "trace_index"),
)
# The filter a selective ingest (``--logs``) made the database with: one row, none in
# a database of whole blocks. ``addresses`` and ``topic0s`` are sorted JSON lists of
# lowercase hex (empty: any); ``from_block`` is the lowest block scanned for them.
LOG_FILTER: Final = Table(
    "log_filter",
    (
        Column("addresses", J),
        Column("topic0s", J),
        Column("from_block", INT),
    ),
    key=(),
)

# The ABI registry (``blockx chain abi``): one row per registered ABI. ``abi`` is its
# entries as a JSON list in the form of a compiler's ABI file; ``addresses`` the
# sorted JSON list of the contracts it is registered for (empty: any contract);
# ``revision`` grows with every change, so a reader notices one by reading
# ``count(*)`` and ``max(revision)`` alone.
ABIS: Final = Table(
    "abis",
    (
        Column("name", T),
        Column("abi", J),
        Column("addresses", J),
        Column("revision", INT),
    ),
    key=("name",),
)

# When ingest stored a block: in ``blocks``, after the chain's columns (version 2).
SEEN_AT: Final = Column("seen_at_ms", INT, nullable=True)
# Whether the database holds traces: in ``chain``, 0 or 1.
TRACED: Final = Column("traces", INT)

# Tables keyed by block: what delete_above removes, what insert_blocks replaces,
# what ``rows`` reads (ordered by the table's key) and what no sink may target. A
# new table with ``block_number`` and ``block_hash`` columns needs only to be
# listed here (and created by a migration) to be served by io.blockdb and scanned
# by the Builders.
BLOCK_TABLES: Final = (
    BLOCKS,
    TRANSACTIONS,
    LOGS,
    ERC20_TRANSFERS,
    WITHDRAWALS,
    NFT_TRANSFERS,
    TRACES,
    CONTRACTS,
)
TABLES: Final = (*BLOCK_TABLES, CHAIN, REORGS, LOG_FILTER, ABIS)

Index = tuple[str, str, tuple[str, ...]]
INDEXES_V1: Final[tuple[Index, ...]] = (
    ("blocks_by_hash", "blocks", ("block_hash",)),
    ("transactions_by_hash", "transactions", ("transaction_hash",)),
    ("logs_by_topic0", "logs", ("topic0", "block_number")),
    ("logs_by_address", "logs", ("address", "block_number")),
    ("erc20_transfers_by_token", "erc20_transfers", ("token", "block_number")),
)
WITHDRAWALS_INDEXES: Final[tuple[Index, ...]] = (
    ("withdrawals_by_address", "withdrawals", ("address", "block_number")),
    ("withdrawals_by_validator", "withdrawals", ("validator_index", "block_number")),
)
NFT_TRANSFERS_INDEXES: Final[tuple[Index, ...]] = (
    ("nft_transfers_by_token", "nft_transfers", ("token", "block_number")),
)
TRACE_INDEXES: Final[tuple[Index, ...]] = (
    ("traces_by_to", "traces", ("to_address", "block_number")),
    ("contracts_by_address", "contracts", ("address",)),
)
INDEXES: Final = (*INDEXES_V1, *WITHDRAWALS_INDEXES, *NFT_TRANSFERS_INDEXES, *TRACE_INDEXES)

# keccak256("Transfer(address,address,uint256)"): ERC-20's and ERC-721's.
TRANSFER_TOPIC: Final = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
# keccak256("TransferSingle(address,address,address,uint256,uint256)")
TRANSFER_SINGLE_TOPIC: Final = "0xc3d58168c5ae7397731d063d5bbf3d657854427343f4c083240f7aacaa2d0f62"
# keccak256("TransferBatch(address,address,address,uint256[],uint256[])")
TRANSFER_BATCH_TOPIC: Final = "0x4a39dc06d4c0dbc64b70af90fd698a233a518aa5d07e595d983b8c0526c8f7fb"


class NftStandard(enum.StrEnum):
    """``nft_transfers.standard``: the standard whose event a row comes from."""

    ERC721 = "erc721"
    ERC1155 = "erc1155"


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


def create_index(index: Index) -> str:
    name, table, columns = index
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
    statements += [create_index(index) for index in INDEXES_V1]
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
    statements += [create_index(index) for index in WITHDRAWALS_INDEXES]
    return statements


def _nft_transfers(engine: Engine) -> list[str]:
    return [create_table(NFT_TRANSFERS, engine), *map(create_index, NFT_TRANSFERS_INDEXES)]


def _traces(engine: Engine) -> list[str]:
    """``traces`` and ``contracts``, and ``chain.traces`` (0: no traces ingested)."""
    return [
        create_table(TRACES, engine),
        create_table(CONTRACTS, engine),
        *(create_index(index) for index in TRACE_INDEXES),
        f"ALTER TABLE chain ADD COLUMN {TRACED.name} {_SQL_TYPES[engine][INT]} NOT NULL DEFAULT 0",
    ]


def _log_filter(engine: Engine) -> list[str]:
    return [
        create_table(LOG_FILTER, engine),
        "CREATE UNIQUE INDEX log_filter_one_row ON log_filter ((1))",
    ]


def _abis(engine: Engine) -> list[str]:
    return [create_table(ABIS, engine)]


MIGRATIONS: Final = (
    _schema_v1,
    _seen_at_v2,
    _every_column_v3,
    _nft_transfers,
    _traces,
    _log_filter,
    _abis,
)
SCHEMA_VERSION: Final = len(MIGRATIONS)
# The schema version that added ``log_filter``.
LOG_FILTER_SINCE: Final = MIGRATIONS.index(_log_filter) + 1
# The schema version that added the ABI registry, ``abis``.
ABIS_SINCE: Final = MIGRATIONS.index(_abis) + 1
# The schema version that added ``blocks.seen_at_ms``.
SEEN_AT_SINCE: Final = MIGRATIONS.index(_seen_at_v2) + 1
# The schema version that added the header, fee and signature columns and withdrawals.
EVERY_COLUMN_SINCE: Final = MIGRATIONS.index(_every_column_v3) + 1
# The schema version that added ``nft_transfers``.
NFT_TRANSFERS_SINCE: Final = MIGRATIONS.index(_nft_transfers) + 1
# The schema version that added ``traces``, ``contracts`` and ``chain.traces``.
TRACES_SINCE: Final = MIGRATIONS.index(_traces) + 1

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


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    block_number: int
    transaction_index: int
    trace_index: int
    trace_address: list[int]
    transaction_hash: str
    block_hash: str
    type: str
    from_address: str
    to_address: str | None
    value: int | str
    input: str
    output: str
    gas: int
    gas_used: int
    error: str | None
    subtraces: int


class BlockRows(msgspec.Struct, frozen=True, kw_only=True):
    """One block with its transactions, logs, withdrawals and (when traced) call
    frames, as insert_blocks takes it."""

    block: Block
    transactions: Sequence[Transaction] = ()
    logs: Sequence[Log] = ()
    traces: Sequence[Trace] = ()
    withdrawals: Sequence[Withdrawal] = ()


class ChainState(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: int
    genesis_hash: str
    head_number: int | None
    head_hash: str | None
    finalized_number: int | None
    epoch: int


class LogFilterRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a selective database holds: the logs of ``addresses`` (any when empty)
    whose topic0 is one of ``topic0s`` (any when empty), from ``from_block`` up."""

    addresses: tuple[str, ...] = ()
    topic0s: tuple[str, ...] = ()
    from_block: int = 0

    def same_filter(self, other: LogFilterRecord) -> bool:
        return (self.addresses, self.topic0s) == (other.addresses, other.topic0s)

    def describe(self) -> str:
        """``logs of 0xab.. with topic0 0xdd..``, for one-line messages."""
        addresses = ", ".join(self.addresses) if self.addresses else "any address"
        topics = ", ".join(self.topic0s) if self.topic0s else "any"
        return f"the logs of {addresses} with topic0 {topics}"

    def as_json(self) -> dict[str, Any]:
        return {
            "addresses": list(self.addresses),
            "topic0s": list(self.topic0s),
            "from_block": self.from_block,
        }


class AbiRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the ABI registry: ``abi`` its entries as ABI JSON, ``addresses`` the
    contracts it is registered for (lowercase, sorted; empty: any contract)."""

    name: str
    abi: list[Any]
    addresses: tuple[str, ...] = ()
    revision: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "abi": self.abi,
            "addresses": list(self.addresses),
            "revision": self.revision,
        }


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


# How checked_row takes a column's common case inline, without check_value.
_FAST_NONE: Final = 0  # every value goes through check_value
_FAST_INTEGER: Final = 1  # an int in 0 .. 2**63 - 1
_FAST_HEX: Final = 2  # lowercase hex of the column's length
_FAST_UINT256: Final = 3  # an int in 0 .. 2**256 - 1, stored as its decimal text
_FAST_JSON: Final = 4  # a list or an object, stored as compact JSON text
_FAST_FLAG: Final = 5  # 0 or 1


def _fast_way(column: Column) -> tuple[int, re.Pattern[str] | None]:
    if column.type is ColumnType.INTEGER:
        return (_FAST_FLAG if column.name == "success" else _FAST_INTEGER), None
    if column.type in _EXACT_HEX:
        return _FAST_HEX, _EXACT_HEX[column.type]
    if column.type is ColumnType.UINT256:
        return _FAST_UINT256, None
    if column.type is ColumnType.JSON:
        return _FAST_JSON, None
    return _FAST_NONE, None


# Hashes and addresses found well-formed (a value's form never changes: it is text).
_KNOWN_HEX: Final[Mapping[ColumnType, set[str]]] = {H: set(), A: set()}
_KNOWN_HEX_MAX: Final = 20_000  # each: some 3 MB at most

RowChecker = Callable[[msgspec.Struct, str], tuple[Any, ...]]


def _row_checker(table: Table) -> RowChecker:
    """checked_row for ``table`` as straight-line code, made once per table as
    dataclasses makes ``__init__``: per column, its field read, one test of its
    common case (NULL where allowed, an in-range int, lowercase hex of the right
    length, a list or an object), and check_value for anything else, which converts
    it (uppercase hex, a uint256 in text) or raises with the rule it broke."""
    scope: dict[str, Any] = {"check_value": check_value, "json_text": json_text, "table": table}
    lines = ["def checked(row, where):"]
    for i, column in enumerate(table.columns):
        assert column.name.isidentifier(), column.name
        fast, pattern = _fast_way(column)
        v = f"v{i}"
        scope[f"c{i}"] = column
        lines.append(f"    {v} = row.{column.name}")
        slow = f"{v} = check_value(table, c{i}, {v}, where)"
        if fast == _FAST_NONE:
            lines.append(f"    if {v} is not None: {slow}" if column.nullable else f"    {slow}")
            continue
        if fast == _FAST_INTEGER:
            test, keep = f"type({v}) is int and 0 <= {v} <= {MAX_INTEGER}", "pass"
        elif fast == _FAST_FLAG:
            test, keep = f"type({v}) is int and 0 <= {v} <= 1", "pass"
        elif fast == _FAST_HEX and column.type is ColumnType.DATA:
            assert pattern is not None
            scope[f"p{i}"] = pattern.fullmatch
            test, keep = f"type({v}) is str and p{i}({v}) is not None", "pass"
        elif fast == _FAST_HEX:
            # A block's hash is in each of its rows, a transaction's in each of its
            # logs, a token's address in each of its transfers: a hash or an
            # address seen well-formed is not matched again.
            assert pattern is not None
            scope[f"p{i}"], scope[f"k{i}"] = pattern.fullmatch, _KNOWN_HEX[column.type]
            test = f"type({v}) is str and ({v} in k{i} or p{i}({v}) is not None)"
            keep = f"k{i}.add({v}) if len(k{i}) < {_KNOWN_HEX_MAX} else k{i}.clear()"
        elif fast == _FAST_UINT256:
            test, keep = f"type({v}) is int and 0 <= {v} <= {MAX_UINT256}", f"{v} = str({v})"
        else:
            name = f"{table.name}.{column.name} of "
            test = f"type({v}) is list or type({v}) is dict"
            keep = f"{v} = json_text({v}, {name!r} + where)"
        first = f"if {v} is None: pass\n    elif" if column.nullable else "if"
        lines.append(f"    {first} {test}: {keep}\n    else: {slow}")
    values = ", ".join(f"v{i}" for i in range(len(table.columns)))
    lines.append(f"    return ({values},)")
    exec("\n".join(lines), scope)  # the text is made above from the schema alone
    checker: RowChecker = scope["checked"]
    return checker


_CHECKERS: Final[dict[str, tuple[Table, RowChecker]]] = {}


def checked_row(table: Table, row: msgspec.Struct, where: str) -> tuple[Any, ...]:
    """``row``'s values in ``table``'s column order, each checked (see
    _row_checker). Ingest checks every cell of every row, so this is on its hot
    path."""
    made = _CHECKERS.get(table.name)
    if made is None or made[0] is not table:
        made = _CHECKERS[table.name] = (table, _row_checker(table))
    return made[1](row, where)


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


# The topic0 of every event nft_transfers is derived from: any other log is skipped
# after one set lookup, since derivation runs on every log ingest stores.
NFT_TOPICS: Final = frozenset({TRANSFER_TOPIC, TRANSFER_SINGLE_TOPIC, TRANSFER_BATCH_TOPIC})
_WORD: Final = 64  # hex digits in an ABI word


def nft_transfers(log: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The nft_transfers rows of a checked logs row: none when the log is no
    ERC-721 or ERC-1155 transfer.

    * ERC-721 ``Transfer``: four topics (from, to, token id) and no data; one row,
      amount 1, no operator.
    * ERC-1155 ``TransferSingle``: four topics (operator, from, to) and data of
      exactly two words (id, value); one row.
    * ERC-1155 ``TransferBatch``: four topics and data ABI-encoding two uint256
      arrays of the same length; one row per position.

    Any contract can emit any log, so a log that breaks its event's layout (a batch
    whose offsets point outside its data, whose arrays differ in length or run past
    its end) yields no row: it stays in ``logs``, and the block is stored as usual.
    As for erc20_transfers, an address is an address topic's low 20 bytes."""
    t0 = log[6]
    if t0 not in NFT_TOPICS:
        return []
    (number, log_index, tx_index, tx_hash, block_hash, token, _, t1, t2, t3, data) = log
    if t1 is None or t2 is None or t3 is None:
        return []
    if t0 == TRANSFER_TOPIC:
        if data != "0x":
            return []
        standard, operator, sender, receiver = NftStandard.ERC721, None, t1, t2
        pairs = [(str(int(t3, 16)), "1")]
    else:
        standard, operator, sender, receiver = NftStandard.ERC1155, "0x" + t1[-40:], t2, t3
        words = data[2:]
        if t0 == TRANSFER_SINGLE_TOPIC:
            if len(words) != 2 * _WORD:
                return []
            pairs = [(str(int(words[:_WORD], 16)), str(int(words[_WORD:], 16)))]
        else:
            batch = _batch(words)
            if batch is None:
                return []
            pairs = batch
    common = (tx_index, tx_hash, block_hash, standard.value, token, operator)
    ends = ("0x" + sender[-40:], "0x" + receiver[-40:])
    return [
        (number, log_index, position, *common, *ends, token_id, amount)
        for position, (token_id, amount) in enumerate(pairs)
    ]


def _batch(words: str) -> list[tuple[str, str]] | None:
    """``TransferBatch``'s (id, value) pairs from its data's hex digits, or None when
    they do not ABI-decode as two uint256 arrays of one length within the data."""
    ids = _uint_array(words, 0)
    values = _uint_array(words, 1)
    if ids is None or values is None or len(ids) != len(values):
        return None
    return list(zip(ids, values, strict=True))


def _uint_array(words: str, head: int) -> list[str] | None:
    """The uint256 array whose offset is the ``head``-th word, as decimal strings;
    None when the offset or the array's length take it outside ``words``."""
    size = len(words)
    if size < (head + 1) * _WORD:
        return None
    offset = int(words[head * _WORD : (head + 1) * _WORD], 16) * 2
    if offset + _WORD > size:
        return None
    count = int(words[offset : offset + _WORD], 16)
    start = offset + _WORD
    if count > (size - start) // _WORD:
        return None
    return [str(int(words[start + i * _WORD : start + (i + 1) * _WORD], 16)) for i in range(count)]


class CreationKind(enum.StrEnum):
    """How a contract in ``contracts`` was made: the CREATE or CREATE2 that made it (a
    transaction without a recipient is a CREATE)."""

    CREATE = "create"
    CREATE2 = "create2"


_CREATIONS: Final = frozenset(kind.value for kind in CreationKind)


# Where a checked transactions row holds these columns.
_TX_SUCCESS: Final = TRANSACTIONS.names.index("success")
_TX_CONTRACT_ADDRESS: Final = TRANSACTIONS.names.index("contract_address")


def created_by_transaction(tx: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The contracts row of a checked transactions row, or None when it made no
    contract (it has a recipient, or it failed: a failed deployment's receipt may
    still name the address it would have had)."""
    (number, index, tx_hash, block_hash, sender, to) = tx[:6]
    success, address = tx[_TX_SUCCESS], tx[_TX_CONTRACT_ADDRESS]
    if to is not None or address is None or success == 0:
        return None
    return (number, index, 0, "[]", tx_hash, block_hash, address, sender, CreationKind.CREATE.value)


def created_inside(
    frames: Sequence[Trace], checked: Sequence[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """The contracts rows of one transaction's create and create2 frames below its
    own frame (``checked``: their checked traces rows). A creation counts when
    neither its frame nor any frame above it failed: a revert undoes it."""
    failed: set[tuple[int, ...]] = set()
    made: list[tuple[Any, ...]] = []
    for frame, row in zip(frames, checked, strict=True):
        address = tuple(frame.trace_address)
        if frame.error is not None or address[:-1] in failed:
            failed.add(address)
            continue
        if address and frame.type in _CREATIONS and row[8] is not None:
            # The traces row's block, transaction and frame, then address and creator.
            made.append((*row[:6], row[8], row[7], frame.type))
    return made


def block_row_sets(
    blocks: Sequence[BlockRows],
) -> dict[str, list[tuple[Any, ...]]]:
    """The checked rows of every block table for ``blocks``, erc20_transfers and
    nft_transfers derived from the logs and contracts from the transactions and
    traces; RowError on the first row that breaks a rule, or on a transaction, log
    or frame whose block_number is not its block's."""
    rows: dict[str, list[tuple[Any, ...]]] = {t.name: [] for t in BLOCK_TABLES}
    for bundle in blocks:
        number = bundle.block.block_number
        rows[BLOCKS.name].append(checked_row(BLOCKS, bundle.block, f"block {number}"))
        for tx in bundle.transactions:
            where = f"block {number} transaction {tx.transaction_index}"
            if tx.block_number != number:
                raise RowError(f"{where} says block_number {tx.block_number}")
            checked_tx = checked_row(TRANSACTIONS, tx, where)
            rows[TRANSACTIONS.name].append(checked_tx)
            created = created_by_transaction(checked_tx)
            if created is not None:
                rows[CONTRACTS.name].append(created)
        _trace_rows(number, bundle.traces, rows)
        for log in bundle.logs:
            where = f"block {number} log {log.log_index}"
            if log.block_number != number:
                raise RowError(f"{where} says block_number {log.block_number}")
            checked = checked_row(LOGS, log, where)
            rows[LOGS.name].append(checked)
            transfer = erc20_transfer(checked)
            if transfer is not None:
                rows[ERC20_TRANSFERS.name].append(transfer)
            elif checked[6] in NFT_TOPICS:
                rows[NFT_TRANSFERS.name] += nft_transfers(checked)
        for withdrawal in bundle.withdrawals:
            where = f"block {number} withdrawal {withdrawal.position}"
            if withdrawal.block_number != number:
                raise RowError(f"{where} says block_number {withdrawal.block_number}")
            rows[WITHDRAWALS.name].append(checked_row(WITHDRAWALS, withdrawal, where))
    return rows


def _trace_rows(
    number: int, traces: Sequence[Trace], rows: dict[str, list[tuple[Any, ...]]]
) -> None:
    """The checked traces rows of one block's frames (one transaction's frames
    after another), and the contracts its transactions created inside."""
    frames: list[Trace] = []
    checked: list[tuple[Any, ...]] = []
    for frame in traces:
        where = f"block {number} transaction {frame.transaction_index} frame {frame.trace_index}"
        if frame.block_number != number:
            raise RowError(f"{where} says block_number {frame.block_number}")
        if frames and frame.transaction_index != frames[0].transaction_index:
            rows[CONTRACTS.name] += created_inside(frames, checked)
            frames, checked = [], []
        row = checked_row(TRACES, frame, where)
        rows[TRACES.name].append(row)
        frames.append(frame)
        checked.append(row)
    if frames:
        rows[CONTRACTS.name] += created_inside(frames, checked)


for _table, _struct in (
    (BLOCKS, Block),
    (TRANSACTIONS, Transaction),
    (LOGS, Log),
    (WITHDRAWALS, Withdrawal),
    (TRACES, Trace),
):
    # checked_row reads a row's fields in order: they are the table's columns.
    assert _struct.__struct_fields__ == _table.names, _table.name


def chain_row(values: Mapping[str, Any]) -> ChainState:
    return msgspec.convert(dict(values), ChainState)
