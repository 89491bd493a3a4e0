"""``io.blockdb_executor``: read-only SQL over real SQLite files and a real
PostgreSQL (its role created here as the superuser), through the IoRouter."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from chain_rows import GENESIS, block_hash, make_block
from postgres import PostgresServer, read_only_role

from blockx_chain.schema import Engine
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.store.query import (
    DEFAULT_QUERY_TIMEOUT_MS,
    QueryLimits,
    QueryRefused,
    Statement,
    prepare,
)
from blockx_chain.store.query_engine import open_queries
from blockx_chain.url import PostgresUrl, parse_blockdb_url
from blockx_core.failures import IoErrorKind
from blockx_server.calls.config import CALL_DEADLINE_MS
from blockx_server.io.backends.blockdb_executor import BlockDbExecutorBackend
from blockx_server.io.backends.rpc import RpcSettings
from blockx_server.io.chain_config import (
    ChainSettings,
    close_chains,
    open_chains,
    read_chain_settings,
)
from blockx_server.io.config import BlockDbSettings, open_router, read_blockdb_settings
from blockx_server.io.errors import IoFailed, IoOk, IoReason
from blockx_server.io.finality import StaticFinality
from blockx_server.io.router import IoRouter
from blockx_server.runtime.env import ConfigError, ConfigReader, EnvironSource
from blockx_server.runtime.process import StartupError

LIMITS = QueryLimits(max_rows=50, max_bytes=200_000, timeout_ms=1000)


class Db(msgspec.Struct):
    engine: str
    url: str  # the block database (the writer's URL)
    executor: PostgresUrl | None  # the read-only role's URL on PostgreSQL


async def _fill(url: str, chain_id: int = 31337) -> None:
    store = await open_store(parse_blockdb_url(url))
    async with store.writer() as w:
        await w.init_chain(chain_id, GENESIS)
        await w.insert_blocks([make_block(n) for n in range(8)])
        await w.set_chain(head_number=7, head_hash=block_hash(7), finalized_number=5, epoch=1)
    await store.close()


@pytest_asyncio.fixture
async def db(db_url: str) -> Db:
    await _fill(db_url)
    if db_url.startswith("sqlite"):
        return Db("sqlite", db_url, None)
    return Db("postgres", db_url, await read_only_role(db_url))


async def _backend(db: Db, limits: QueryLimits = LIMITS) -> BlockDbExecutorBackend:
    backend = BlockDbExecutorBackend(parse_blockdb_url(db.url), limits, db.executor)
    await backend.start()
    return backend


@pytest_asyncio.fixture
async def io(db: Db) -> AsyncIterator[IoRouter]:
    backend = await _backend(db)
    yield open_router(None, [backend], finality=StaticFinality(finalized=5, epoch=1))
    await backend.close()


async def query(io: IoRouter, *args: Any, **kwargs: Any) -> Any:
    outcome = await io.execute("blockdb_executor", "query", list(args), kwargs, writes=False)
    assert isinstance(outcome, IoOk), outcome
    return msgspec.json.decode(outcome.value_json)


async def refused(io: IoRouter, *args: Any, **kwargs: Any) -> IoFailed:
    outcome = await io.execute("blockdb_executor", "query", list(args), kwargs, writes=False)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind is IoErrorKind.BAD_REQUEST, outcome
    assert not outcome.retryable
    return outcome


async def test_a_query_answers_rows_with_bound_parameters(io: IoRouter) -> None:
    rows = await query(
        io,
        "SELECT block_number, block_hash FROM blocks WHERE block_number BETWEEN ? AND ? "
        "ORDER BY block_number",
        [2, 4],
    )
    assert rows == [{"block_number": n, "block_hash": block_hash(n)} for n in (2, 3, 4)]
    named = await query(
        io,
        "SELECT count(*) AS n FROM logs WHERE block_number >= :low AND block_number <= :low",
        {"low": 3},
    )
    assert named == [{"n": 4}]
    # An aggregate over a range, joined: what pulling rows into Python would do.
    totals = await query(
        io,
        "SELECT t.token, count(*) AS transfers, max(b.block_number) AS last "
        "FROM erc20_transfers t JOIN blocks b ON b.block_number = t.block_number "
        "GROUP BY t.token",
    )
    assert [r["transfers"] for r in totals] == [16]
    assert totals[0]["last"] == 7
    # A trailing semicolon ends the one statement; a value that looks like SQL is a value.
    assert await query(io, "SELECT ? AS v;", ["1; DROP TABLE blocks"]) == [
        {"v": "1; DROP TABLE blocks"}
    ]


# Every kind of statement refused, on both engines: (sql, words in the message).
REFUSED = [
    ("INSERT INTO chain (chain_id) VALUES (1)", "INSERT statement is refused"),
    ("UPDATE blocks SET block_hash = 'x'", "UPDATE statement is refused"),
    ("DELETE FROM logs", "DELETE statement is refused"),
    ("CREATE TABLE mine (a INTEGER)", "CREATE statement is refused"),
    ("DROP TABLE blocks", "DROP statement is refused"),
    ("ATTACH DATABASE '/tmp/other.db' AS other", "ATTACH statement is refused"),
    ("DETACH DATABASE main", "DETACH statement is refused"),
    ("PRAGMA writable_schema = ON", "PRAGMA statement is refused"),
    ("SET statement_timeout = 0", "SET statement is refused"),
    ("SELECT 1; DROP TABLE blocks", "multiple statements are refused"),
    ("SELECT 1; SELECT 2", "second statement starts at 'SELECT 2'"),
    ("SELECT 'a;b' AS s; -- x\n DELETE FROM logs", "multiple statements"),
]


@pytest.mark.parametrize(("sql", "words"), REFUSED)
async def test_statements_other_than_one_select_are_refused(
    io: IoRouter, sql: str, words: str
) -> None:
    assert words in (await refused(io, sql)).message


# Writes and reads the text cannot see, refused by the engine: the SQLite authorizer,
# PostgreSQL's READ ONLY transaction and its role. (sql, SQLite's words, PostgreSQL's).
ENGINE_REFUSED = [
    (
        "WITH x AS (SELECT 1) INSERT INTO chain (chain_id) SELECT 2",
        "INSERT chain is refused",
        "read-only transaction",
    ),
    ("WITH x AS (SELECT 1) DELETE FROM logs", "DELETE logs is refused", "read-only transaction"),
    (
        "WITH x AS (SELECT 1) UPDATE blocks SET block_hash = 'x'",
        "UPDATE blocks block_hash is refused",
        "read-only transaction",
    ),
    ("SELECT * FROM abis", "reading abis is refused", "permission denied for table abis"),
    ("SELECT * FROM reorgs", "reading reorgs is refused", "permission denied for table reorgs"),
    (
        "SELECT * FROM log_filter",
        "reading log_filter is refused",
        "permission denied for table log_filter",
    ),
    ("SELECT * FROM _blockx_sink", "reading _blockx_sink is refused", "permission denied"),
    ("SELECT name FROM sqlite_master", "reading sqlite_master is refused", "does not exist"),
    ("SELECT * FROM temp.sqlite_master", "reading temp.sqlite_temp_master", "does not exist"),
    ("SELECT * FROM pragma_table_info('blocks')", "PRAGMA functions too", "does not exist"),
    ("SELECT count(*) FROM _blockx_sink", "reading _blockx_sink is refused", "permission denied"),
]


@pytest.mark.parametrize(("sql", "sqlite_words", "postgres_words"), ENGINE_REFUSED)
async def test_the_engine_refuses_writes_and_other_tables(
    db: Db, io: IoRouter, sql: str, sqlite_words: str, postgres_words: str
) -> None:
    # The sink shares the block database: its tables are no chain table.
    sink = await open_sink(parse_blockdb_url(db.url))
    await sink.identity()
    await sink.close()
    failed = await refused(io, sql)
    assert (sqlite_words if db.engine == "sqlite" else postgres_words) in failed.message


async def test_a_runaway_query_is_stopped_at_the_time_limit(db: Db) -> None:
    backend = await _backend(db, msgspec.structs.replace(LIMITS, timeout_ms=200))
    io = open_router(None, [backend])
    runaway = (
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    )
    failed = await refused(io, runaway)
    assert "longer than 200 ms (BLOCKDB_QUERY_TIMEOUT_MS)" in failed.message
    # The connection serves the next query.
    assert await query(io, "SELECT count(*) AS n FROM blocks") == [{"n": 8}]
    await backend.close()


async def test_rows_and_bytes_are_bounded_while_fetching(db: Db) -> None:
    backend = await _backend(db, QueryLimits(max_rows=10, max_bytes=4000, timeout_ms=60_000))
    io = open_router(None, [backend])
    too_many = await refused(io, "SELECT block_number, log_index FROM logs")
    assert "more than 10 rows (BLOCKDB_MAX_ROWS)" in too_many.message
    assert too_many.reason is IoReason.TOO_MANY_ROWS
    # Endless rows stop at the bound, long before the time limit.
    endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r"
    assert "BLOCKDB_MAX_ROWS" in (await refused(io, endless)).message
    too_big = await refused(io, "SELECT * FROM transactions")
    assert "larger than 4000 bytes (BLOCKDB_QUERY_MAX_BYTES)" in too_big.message
    assert len(await query(io, "SELECT block_number FROM transactions LIMIT 10")) == 10
    await backend.close()


# Parameters are bound values only.
BAD_PARAMS = [
    ("SELECT ? AS v", "1", "params must be a list"),
    ("SELECT ? AS v", [[1]], "parameter 1 is a list"),
    ("SELECT ? AS v", [], "1 ? parameter(s) and params holds 0"),
    ("SELECT :a AS v", {"b": 1}, "missing: a; not in the SQL: b"),
    ("SELECT :a AS v, ? AS w", [1, 2], "mixes ? and :name"),
    ("SELECT $1 AS v", [1], "parameter mark $1 is refused"),
    ("SELECT $1 AS v", [], "parameter mark $1 is refused"),
    ("SELECT ? AS v", [2**64], "beyond a 64-bit integer"),
]


@pytest.mark.parametrize(("sql", "params", "words"), BAD_PARAMS)
async def test_parameters_are_bound_values_only(
    db: Db, io: IoRouter, sql: str, params: Any, words: str
) -> None:
    assert words in (await refused(io, sql, params)).message


async def test_a_pinned_query_reads_only_blocks_through_its_block(io: IoRouter, db: Db) -> None:
    counts = (
        "SELECT (SELECT count(*) FROM blocks) AS blocks, (SELECT max(block_number) FROM logs) "
        "AS last_log, (SELECT count(*) FROM erc20_transfers) AS transfers"
    )
    assert await query(io, counts, through_block=3) == [
        {"blocks": 4, "last_log": 3, "transfers": 8}
    ]
    # A statement's own WITH (and WITH RECURSIVE) keeps its tables after the pins.
    own = "WITH t AS (SELECT block_number FROM transactions) SELECT count(*) AS n FROM t"
    assert await query(io, own, through_block=1) == [{"n": 4}]
    recursive = (
        "WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r WHERE n < 9) "
        "SELECT count(*) AS n FROM r JOIN blocks b ON b.block_number = r.n"
    )
    assert await query(io, recursive, through_block=2) == [{"n": 3}]
    schema = "main" if db.engine == "sqlite" else "public"
    for sql, words in [
        (f"SELECT count(*) FROM {schema}.blocks", f"{schema}.blocks would read past"),
        (f'SELECT count(*) FROM "{schema}" . "logs"', "would read past"),
        ("SELECT finalized_number FROM chain", "chain changes as the chain moves"),
    ]:
        assert words in (await refused(io, sql, through_block=3)).message
    if db.engine == "postgres":
        hidden = "SELECT query_to_xml('select * from public.blocks', true, false, '')"
        assert "may not call query_to_xml()" in (await refused(io, hidden, through_block=3)).message


async def test_sqlite_reads_json_functions_and_refuses_its_bracketed_names(
    tmp_path: Path,
) -> None:
    """SQLite's own forms: table-valued functions, bracketed names."""
    url = f"sqlite:///{tmp_path}/chain.db"
    await _fill(url)
    backend = await _backend(Db("sqlite", url, None))
    io = open_router(None, [backend])
    # json_each and json_tree read only their argument.
    assert await query(io, "SELECT count(*) AS n FROM json_each('[1, 2]')") == [{"n": 2}]
    # A bracketed schema name is SQLite's own quoting.
    failed = await refused(io, "SELECT count(*) FROM [main].[blocks]", through_block=1)
    assert "would read past through_block" in failed.message
    await backend.close()


async def test_only_a_query_pinned_at_or_below_finalized_is_cached(io: IoRouter) -> None:
    sql = "SELECT count(*) AS n FROM blocks"
    pinned = await io.execute(
        "blockdb_executor", "query", [sql], {"through_block": 5}, writes=False
    )
    again = await io.execute("blockdb_executor", "query", [sql], {"through_block": 5}, writes=False)
    assert isinstance(pinned, IoOk)
    assert isinstance(again, IoOk)
    assert (pinned.cached, again.cached) == (False, True)
    assert msgspec.json.decode(again.value_json) == [{"n": 6}]
    for kwargs in ({}, {"through_block": 6}):
        first = await io.execute("blockdb_executor", "query", [sql], kwargs, writes=False)
        second = await io.execute("blockdb_executor", "query", [sql], kwargs, writes=False)
        assert isinstance(second, IoOk)
        assert isinstance(first, IoOk)
        assert not second.cached, kwargs
    backend = io.backend("blockdb_executor")
    assert backend is not None
    assert backend.immutable("query", [sql], {"through_block": 5}, 5)
    assert not backend.immutable("query", [sql], {"through_block": 5}, None)
    assert not backend.immutable("query", ["DELETE FROM blocks"], {"through_block": 1}, 5)


async def _chain(db: Db, executor: PostgresUrl | None) -> ChainSettings:
    blockdb = BlockDbSettings(
        url=parse_blockdb_url(db.url),
        max_rows=50,
        query_timeout_ms=1000,
        executor_url=executor,
    )
    return ChainSettings(name="mainnet", chain_id=31337, blockdb=blockdb)


async def test_each_chain_has_its_executor_reached_through_the_router(db: Db) -> None:
    chains = await open_chains((await _chain(db, db.executor),), finality_refresh_ms=1000)
    try:
        io = open_router(None, chains=chains)
        outcome = await io.execute(
            "router",
            "chain",
            ["mainnet", "blockdb_executor", "query", "SELECT count(*) AS n FROM blocks"],
            {},
            writes=False,
        )
        assert isinstance(outcome, IoOk), outcome
        assert msgspec.json.decode(outcome.value_json) == [{"n": 8}]
        assert await query(io, "SELECT count(*) AS n FROM logs") == [{"n": 32}]
    finally:
        await close_chains(chains)


async def test_postgres_without_the_role_has_no_executor_and_says_why(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await _fill(postgres_url)
    db = Db("postgres", postgres_url, None)
    with caplog.at_level(logging.INFO):
        chains = await open_chains((await _chain(db, None),), finality_refresh_ms=1000)
    try:
        assert "blockdb_executor" not in chains[0].backends
        assert any(
            "io.blockdb_executor is off: set [chains.mainnet] blockdb_executor_url" in r.message
            for r in caplog.records
        )
        io = open_router(None, chains=chains)
        outcome = await io.execute(
            "blockdb_executor", "query", ["SELECT 1"], {}, writes=False, chain="mainnet"
        )
        assert isinstance(outcome, IoFailed), outcome
        assert outcome.kind is IoErrorKind.UNKNOWN_BACKEND
        assert "blockdb_executor_url" in outcome.message
    finally:
        await close_chains(chains)
    # The one-chain shorthand names its variable.
    no_chain = await open_router(None).execute(
        "blockdb_executor", "query", ["SELECT 1"], {}, writes=False
    )
    assert isinstance(no_chain, IoFailed)
    assert "BLOCKDB_EXECUTOR_URL" in no_chain.message


@pytest.mark.parametrize("grants", ["SELECT, INSERT", "superuser"])
async def test_a_role_that_can_write_refuses_start_up(postgres_url: str, grants: str) -> None:
    await _fill(postgres_url)
    executor = parse_blockdb_url(postgres_url)
    if grants != "superuser":
        executor = await read_only_role(postgres_url, grants=grants)
    assert isinstance(executor, PostgresUrl)
    db = Db("postgres", postgres_url, executor)
    with pytest.raises(StartupError) as refused_start:
        await open_chains((await _chain(db, executor),), finality_refresh_ms=1000)
    message = str(refused_start.value)
    assert message.startswith("[chains.mainnet] blockdb_executor_url: ")
    assert ("can write blocks" if grants != "superuser" else "is a superuser") in message


async def test_a_role_on_another_chains_database_refuses_start_up(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    await _fill(postgres_url)
    other = await postgres_server.new_database()
    await _fill(other, chain_id=5)
    executor = await read_only_role(other)
    db = Db("postgres", postgres_url, executor)
    with pytest.raises(StartupError, match="its database holds chain id 5, not 31337"):
        await open_chains((await _chain(db, executor),), finality_refresh_ms=1000)


def _read(env: dict[str, str]) -> tuple[BlockDbSettings | None, ConfigReader]:
    reader = ConfigReader(EnvironSource(env))
    return read_blockdb_settings(reader), reader


def test_settings_default_the_timeout_to_the_call_deadline(tmp_path: Path) -> None:
    assert CALL_DEADLINE_MS.default == DEFAULT_QUERY_TIMEOUT_MS
    url = f"sqlite:///{tmp_path}/chain.db"
    settings, reader = _read({"BLOCKDB_URL": url, "CALL_DEADLINE_MS": "1234"})
    reader.finish()
    assert settings is not None
    assert settings.query_limits().timeout_ms == 1234
    settings, reader = _read(
        {
            "BLOCKDB_URL": "postgresql://blockx@db/chain",
            "BLOCKDB_QUERY_TIMEOUT_MS": "77",
            "BLOCKDB_QUERY_MAX_BYTES": "4096",
            "BLOCKDB_EXECUTOR_URL": "postgresql://blockx_sql@db/chain",
        }
    )
    reader.finish()
    assert settings is not None
    assert settings.query_limits() == QueryLimits(max_rows=100_000, max_bytes=4096, timeout_ms=77)
    assert settings.executor_url is not None
    assert settings.executor_url.host == "db"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        (
            {"BLOCKDB_URL": "sqlite:////x.db", "BLOCKDB_EXECUTOR_URL": "postgresql://r@h/d"},
            "BLOCKDB_EXECUTOR_URL is for a PostgreSQL BLOCKDB_URL",
        ),
        (
            {"BLOCKDB_URL": "postgresql://r@h/d", "BLOCKDB_EXECUTOR_URL": "sqlite:////x.db"},
            "BLOCKDB_EXECUTOR_URL must be a postgresql:// URL",
        ),
        ({"BLOCKDB_QUERY_TIMEOUT_MS": "0"}, "BLOCKDB_QUERY_TIMEOUT_MS"),
        ({"BLOCKDB_QUERY_MAX_BYTES": "12"}, "BLOCKDB_QUERY_MAX_BYTES"),
    ],
)
def test_bad_settings_name_their_variable(env: dict[str, str], words: str) -> None:
    _, reader = _read(env)
    with pytest.raises(ConfigError) as bad:
        reader.finish()
    assert words in str(bad.value)


def test_a_chain_table_names_its_executor_url() -> None:
    reader = ConfigReader(
        EnvironSource(
            {
                "chains.main.chain_id": "1",
                "chains.main.blockdb_url": "postgresql://blockx@db/main",
                "chains.main.blockdb_executor_url": "postgresql://blockx_sql@db/main",
                "chains.lite.chain_id": "2",
                "chains.lite.blockdb_url": "sqlite:////lite.db",
                "chains.lite.blockdb_executor_url": "postgresql://blockx_sql@db/lite",
            }
        )
    )
    chains = read_chain_settings(reader, None, RpcSettings())
    with pytest.raises(ConfigError) as bad:
        reader.finish()
    assert "chains.lite.blockdb_executor_url is for a PostgreSQL blockdb_url" in str(bad.value)
    (main,) = chains
    assert main.blockdb is not None
    assert main.blockdb.executor_url is not None
    assert main.blockdb.executor_url.database == "main"


async def test_each_engine_refuses_a_second_statement_itself(db: Db) -> None:
    """Under the tokenizer: sqlite3 and asyncpg's extended protocol refuse one too."""
    engine = await open_queries(parse_blockdb_url(db.url), db.executor, LIMITS)
    try:
        for sql in ("SELECT 1; DELETE FROM logs", "SELECT 1; SELECT 2"):
            with pytest.raises(QueryRefused, match="multiple statements"):
                await engine.query(Statement(sql=sql, params=()))
    finally:
        await engine.close()


# The checks of the text alone, per engine: (engine, sql, params, the SQL run or the
# refusal's words).
TEXTS = [
    (Engine.POSTGRES, "SELECT $$a;b$$ AS s", None, "SELECT $$a;b$$ AS s"),
    (Engine.POSTGRES, "SELECT E'\\';' AS s", None, "SELECT E'\\';' AS s"),
    (Engine.POSTGRES, "SELECT 1 /* a /* b */ ; */ + 1", None, "SELECT 1 /* a /* b */ ; */ + 1"),
    (Engine.SQLITE, "SELECT 1 /* a /* b */ ; */", None, "multiple statements"),
    (Engine.SQLITE, 'SELECT "a;b", [c;d], `e;f` FROM t', None, 'SELECT "a;b", [c;d], `e;f` FROM t'),
    (Engine.POSTGRES, "SELECT '?' AS q, ? AS v", [1], "SELECT '?' AS q, $1 AS v"),
    (Engine.POSTGRES, "SELECT :a, :b, :a, 1::int", {"b": 2, "a": 1}, "SELECT $1, $2, $1, 1::int"),
    (Engine.SQLITE, "SELECT :a, :b, :a", {"b": 2, "a": 1}, "SELECT :a, :b, :a"),
    (Engine.SQLITE, "-- note\nSELECT 1; ;  -- end", None, "-- note\nSELECT 1"),
    (Engine.POSTGRES, "SELECT 'unterminated", None, "unterminated string"),
    (Engine.POSTGRES, "", None, "holds no statement"),
    (Engine.POSTGRES, "EXPLAIN ANALYZE SELECT 1", None, "the EXPLAIN statement is refused"),
    (Engine.POSTGRES, "DO $$ BEGIN END $$", None, "the DO statement is refused"),
]


@pytest.mark.parametrize(("engine", "sql", "params", "expected"), TEXTS)
def test_the_text_is_read_with_each_engines_quoting(
    engine: Engine, sql: str, params: Any, expected: str
) -> None:
    if expected[0].islower():  # a refusal's words
        with pytest.raises(QueryRefused, match=re.escape(expected)):
            prepare(sql, params, None, engine)
        return
    statement = prepare(sql, params, None, engine)
    assert statement.sql == expected
    if isinstance(params, dict) and engine is Engine.POSTGRES:
        assert statement.params == (1, 2)


PINNED_REFUSED = [
    (Engine.POSTGRES, 'SELECT * FROM public.U&"\\0062locks"', "would read past"),
    (Engine.POSTGRES, "SELECT * FROM public /* x */ . blocks", "public.blocks would read past"),
    (Engine.SQLITE, "SELECT * FROM `main`.`logs`", "main.logs would read past"),
    (Engine.POSTGRES, "SELECT table_to_xml('blocks', true, false, '')", "table_to_xml()"),
    (Engine.SQLITE, "SELECT * FROM abis", "abis changes as the chain moves"),
    (Engine.SQLITE, "SELECT count(*), random() FROM blocks", "may not use random"),
    (Engine.SQLITE, "SELECT date('now') AS d FROM blocks", "may not read the clock"),
    (Engine.POSTGRES, "SELECT now(), count(*) FROM blocks", "may not use now"),
    (Engine.POSTGRES, "SELECT pg_relation_size('blocks')", "may not use pg_relation_size"),
    (Engine.POSTGRES, "SELECT reltuples FROM pg_catalog.pg_class", "may not use pg_catalog"),
]


@pytest.mark.parametrize(("engine", "sql", "words"), PINNED_REFUSED)
def test_a_pinned_statement_names_the_block_tables_plainly(
    engine: Engine, sql: str, words: str
) -> None:
    with pytest.raises(QueryRefused, match=re.escape(words)):
        prepare(sql, None, 10, engine)
    prepare(sql, None, None, engine)  # unpinned, the text is no concern of the pin
