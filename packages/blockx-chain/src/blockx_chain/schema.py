"""The block database's schema: one set of tables for SQLite and PostgreSQL.

Rules every row obeys, checked on write (``RowError`` names the column and row):

* hashes, addresses, topics and data are lowercase ``0x`` hex; empty input or
  data is ``"0x"``; absent values are NULL (a contract creation's ``to_address``,
  missing topics, a pre-London ``base_fee_per_gas``);
* ``value``, ``token_id`` and ``amount`` are uint256 decimal strings (SQLite
  TEXT, PostgreSQL NUMERIC(78,0)), because they do not fit 64 bits;
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
from collections.abc import Iterable, Mapping, Sequence
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

# When ingest stored a block: in ``blocks``, after the chain's columns (version 2).
SEEN_AT: Final = Column("seen_at_ms", INT, nullable=True)
# Whether the database holds traces: in ``chain``, 0 or 1.
TRACED: Final = Column("traces", INT)

# Tables keyed by block: what delete_above removes, and what insert_blocks replaces.
BLOCK_TABLES: Final = (
    BLOCKS,
    TRANSACTIONS,
    LOGS,
    ERC20_TRANSFERS,
    NFT_TRANSFERS,
    TRACES,
    CONTRACTS,
)
TABLES: Final = (*BLOCK_TABLES, CHAIN, REORGS)

Index = tuple[str, str, tuple[str, ...]]
INDEXES_V1: Final[tuple[Index, ...]] = (
    ("blocks_by_hash", "blocks", ("block_hash",)),
    ("transactions_by_hash", "transactions", ("transaction_hash",)),
    ("logs_by_topic0", "logs", ("topic0", "block_number")),
    ("logs_by_address", "logs", ("address", "block_number")),
    ("erc20_transfers_by_token", "erc20_transfers", ("token", "block_number")),
)
NFT_TRANSFERS_INDEXES: Final[tuple[Index, ...]] = (
    ("nft_transfers_by_token", "nft_transfers", ("token", "block_number")),
)
TRACE_INDEXES: Final[tuple[Index, ...]] = (
    ("traces_by_to", "traces", ("to_address", "block_number")),
    ("contracts_by_address", "contracts", ("address",)),
)
INDEXES: Final = (*INDEXES_V1, *NFT_TRANSFERS_INDEXES, *TRACE_INDEXES)

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
        if table is REORGS and column.name == "id":
            # Ids only grow, even after deletes: followers use them as a cursor.
            lines.append(
                "id INTEGER PRIMARY KEY AUTOINCREMENT"
                if engine is Engine.SQLITE
                else "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
            )
            continue
        null = "" if column.nullable else " NOT NULL"
        lines.append(f"{column.name} {types[column.type]}{null}")
    if table.key and table is not REORGS:
        lines.append(f"PRIMARY KEY ({', '.join(table.key)})")
    return f"CREATE TABLE {table.name} (\n    " + ",\n    ".join(lines) + "\n)"


def create_index(index: Index) -> str:
    name, table, columns = index
    return f"CREATE INDEX {name} ON {table} ({', '.join(columns)})"


def _schema_v1(engine: Engine) -> list[str]:
    # The first version's tables, as they were: later tables come by migration.
    v1 = (BLOCKS, TRANSACTIONS, LOGS, ERC20_TRANSFERS, CHAIN, REORGS)
    statements = [create_table(table, engine) for table in v1]
    statements += [create_index(index) for index in INDEXES_V1]
    # The chain table holds one row: a unique index on a constant refuses a second.
    statements.append("CREATE UNIQUE INDEX chain_one_row ON chain ((1))")
    return statements


def _seen_at_v2(engine: Engine) -> list[str]:
    return [f"ALTER TABLE blocks ADD COLUMN {SEEN_AT.name} {_SQL_TYPES[engine][SEEN_AT.type]}"]


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


MIGRATIONS: Final = (_schema_v1, _seen_at_v2, _nft_transfers, _traces, _log_filter)
SCHEMA_VERSION: Final = len(MIGRATIONS)
# The schema version that added ``log_filter``.
LOG_FILTER_SINCE: Final = MIGRATIONS.index(_log_filter) + 1
# The schema version that added ``blocks.seen_at_ms``.
SEEN_AT_SINCE: Final = MIGRATIONS.index(_seen_at_v2) + 1
# The schema version that added ``nft_transfers``.
NFT_TRANSFERS_SINCE: Final = MIGRATIONS.index(_nft_transfers) + 1
# The schema version that added ``traces``, ``contracts`` and ``chain.traces``.
TRACES_SINCE: Final = MIGRATIONS.index(_traces) + 1
# The tables each migration creates: a database that already holds a table of one
# of these names is no block database of an older version, and is refused.
NEW_TABLES: Final[Mapping[int, tuple[Table, ...]]] = {
    NFT_TRANSFERS_SINCE: (NFT_TRANSFERS,),
    TRACES_SINCE: (TRACES, CONTRACTS),
    LOG_FILTER_SINCE: (LOG_FILTER,),
}


def tables_in_the_way(version: int, existing: Iterable[str]) -> list[str]:
    """The tables that migrating a database of ``version`` would create but that
    it already holds (``existing``: its table names)."""
    names = set(existing)
    return sorted(
        table.name
        for since, tables in NEW_TABLES.items()
        if since > version
        for table in tables
        if table.name in names
    )


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
    """One block with its transactions, logs and (when traced) call frames, as
    insert_blocks takes it."""

    block: Block
    transactions: Sequence[Transaction] = ()
    logs: Sequence[Log] = ()
    traces: Sequence[Trace] = ()


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


def checked_row(table: Table, row: msgspec.Struct, where: str) -> tuple[Any, ...]:
    """``row``'s values in ``table``'s column order, each checked.

    The common case (an in-range int, lowercase hex of the right length) is
    accepted inline; anything else goes through check_value, which converts it
    (uppercase hex, a uint256) or raises with the rule it broke. Ingest checks
    every cell of every row, so this is on its hot path."""
    values = msgspec.structs.astuple(row)
    out: list[Any] = []
    for column, value in zip(table.columns, values, strict=True):
        kind = column.type
        if kind is ColumnType.INTEGER:
            if type(value) is int and 0 <= value <= MAX_INTEGER and column.name != "success":
                out.append(value)
                continue
        elif (
            kind in _EXACT_HEX
            and type(value) is str
            and _EXACT_HEX[kind].fullmatch(value) is not None
        ):
            out.append(value)
            continue
        out.append(check_value(table, column, value, where))
    return tuple(out)


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


def created_by_transaction(tx: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The contracts row of a checked transactions row, or None when it made no
    contract (it has a recipient, or it failed: a failed deployment's receipt may
    still name the address it would have had)."""
    (number, index, tx_hash, block_hash, sender, to, *_, success, address) = tx
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


for _table, _struct in ((BLOCKS, Block), (TRANSACTIONS, Transaction), (LOGS, Log), (TRACES, Trace)):
    # checked_row reads a row's fields in order: they are the table's columns.
    assert _struct.__struct_fields__ == _table.names, _table.name


def chain_row(values: Mapping[str, Any]) -> ChainState:
    return msgspec.convert(dict(values), ChainState)
