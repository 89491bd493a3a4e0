"""``io.blockdb`` through the IoRouter: reads, error kinds, immutability, settings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chain_rows import GENESIS, block_hash, make_block
from postgres import PostgresServer, find_postgres_bin
from support import free_port

from blockx_chain.store import open_store
from blockx_chain.url import PostgresUrl, SqliteUrl, parse_blockdb_url
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.config import (
    BLOCKDB_SETTINGS,
    BlockDbSettings,
    open_router,
    read_blockdb_settings,
)
from blockx_server.io.errors import IoFailed, IoOk
from blockx_server.io.router import IoRouter
from blockx_server.runtime.env import ConfigError, ConfigReader, EnvironSource


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[tuple[IoRouter, BlockDbBackend]]:
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    store = await open_store(url)
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(n) for n in range(8)])
        await w.set_chain(head_number=7, head_hash=block_hash(7), finalized_number=5, epoch=2)
    await store.close()
    backend = BlockDbBackend(url, max_rows=10)
    await backend.start()
    yield open_router(None, blockdb=backend), backend
    await backend.close()


async def read(router: IoRouter, op: str, *args: Any, **kwargs: Any) -> Any:
    outcome = await router.execute("blockdb", op, list(args), kwargs, writes=False)
    assert isinstance(outcome, IoOk), outcome
    return msgspec.json.decode(outcome.value_json)


async def test_reads_answer_json(router: tuple[IoRouter, BlockDbBackend]) -> None:
    io, backend = router
    assert await read(io, "head") == {"number": 7, "hash": block_hash(7), "finalized": 5}
    assert (await read(io, "block", 3))["block_hash"] == block_hash(3)
    assert len(await read(io, "logs", 2, to_block=3)) == 8
    assert len(await read(io, "erc20_transfers", from_block=2)) == 2
    chain = await backend.chain()
    assert chain is not None
    assert (chain.epoch, chain.finalized_number, chain.head_number) == (2, 5, 7)


CASES = [
    # (op, args, kwargs, kind, words)
    ("logs", [0, 7], {}, IoErrorKind.BAD_REQUEST, "narrow the range"),
    ("blocks", [0, 100], {}, IoErrorKind.BAD_REQUEST, "BLOCKDB_MAX_ROWS"),
    ("block", [], {}, IoErrorKind.BAD_REQUEST, "missing a required argument"),
    ("block", [1], {"hash": "x"}, IoErrorKind.BAD_REQUEST, "unexpected keyword"),
    ("logs", [3, 2], {}, IoErrorKind.BAD_REQUEST, "below from_block"),
    ("insert_blocks", [[]], {}, IoErrorKind.UNKNOWN_OP, "has no operation"),
]


@pytest.mark.parametrize(("op", "args", "kwargs", "kind", "words"), CASES)
async def test_failures_have_their_kinds(
    router: tuple[IoRouter, BlockDbBackend],
    op: str,
    args: list[Any],
    kwargs: dict[str, Any],
    kind: IoErrorKind,
    words: str,
) -> None:
    outcome = await router[0].execute("blockdb", op, args, kwargs, writes=True)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == kind
    assert words in outcome.message
    assert not outcome.retryable


async def test_an_unreachable_database_is_unavailable_and_retryable() -> None:
    port = free_port()
    url = PostgresUrl(
        dsn=f"postgresql://postgres@127.0.0.1:{port}/x", host="127.0.0.1", port=port, database="x"
    )
    backend = BlockDbBackend(url, max_rows=10)
    await backend.start()  # logged, not raised: the database may come later
    outcome = await open_router(None, blockdb=backend).execute(
        "blockdb", "head", [], {}, writes=False
    )
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNAVAILABLE
    assert outcome.retryable


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_worker_never_creates_the_block_database(tmp_path: Path) -> None:
    """BLOCKDB_URL naming no file yet: the Worker starts, creates nothing, and its
    reads answer UNAVAILABLE until ingest has made the database."""
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    backend = BlockDbBackend(url, max_rows=10)
    await backend.start()
    io = open_router(None, blockdb=backend)
    outcome = await io.execute("blockdb", "head", [], {}, writes=False)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNAVAILABLE
    assert f"no block database at {tmp_path}/chain.db" in outcome.message
    assert _names(tmp_path) == []
    store = await open_store(url)  # ingest's open: it creates the database
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(0)])
    await store.close()
    assert (await read(io, "block", 0))["block_number"] == 0
    await backend.close()


async def test_without_the_backend_the_error_names_blockdb_url() -> None:
    outcome = await open_router(None).execute("blockdb", "head", [], {}, writes=False)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNKNOWN_BACKEND
    assert "set BLOCKDB_URL to enable io.blockdb" in outcome.message


IMMUTABLE = [
    # (op, args, kwargs, finalized, immutable)
    ("head", [], {}, 100, False),
    ("block", [5], {}, 5, True),
    ("block", [6], {}, 5, False),
    ("block", [5], {}, None, False),
    ("blocks", [1, 5], {}, 5, True),
    ("blocks", [1, 6], {}, 5, False),
    ("transactions", [], {"block_number": 4}, 5, True),
    ("logs", [3], {}, 5, True),
    ("logs", [3], {"to_block": 9}, 5, False),
    ("logs", [3, None], {"address": "0x" + "11" * 20}, 3, True),
    ("erc20_transfers", [5, 5], {}, 5, True),
    ("erc20_transfers", [6], {}, 5, False),
    ("block", ["5"], {}, 9, False),
    ("block", [True], {}, 9, False),
    ("block", [1, 2], {}, 9, False),
    ("nope", [1], {}, 9, False),
    # A builder's range scan is read once: never cached, finalized or not.
    ("rows", ["erc20_transfers", 1, 5], {}, 9, False),
]


@pytest.mark.parametrize(("op", "args", "kwargs", "finalized", "expected"), IMMUTABLE)
def test_a_read_is_immutable_when_it_names_only_finalized_blocks(
    op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None, expected: bool
) -> None:
    backend = BlockDbBackend(SqliteUrl(Path("/nonexistent/chain.db")), max_rows=10)
    assert backend.immutable(op, args, kwargs, finalized) is expected


def _settings(env: dict[str, str]) -> BlockDbSettings | None:
    reader = ConfigReader(EnvironSource(env))
    settings = read_blockdb_settings(reader)
    reader.finish()
    return settings


def test_settings_read_blockdb_url_and_max_rows(tmp_path: Path) -> None:
    assert _settings({}) is None
    settings = _settings({"BLOCKDB_URL": "sqlite:///rel/chain.db", "BLOCKDB_MAX_ROWS": "5"})
    assert settings == BlockDbSettings(url=SqliteUrl(Path.cwd() / "rel/chain.db"), max_rows=5)
    assert [s.name for s in BLOCKDB_SETTINGS] == [
        "BLOCKDB_URL",
        "BLOCKDB_MAX_ROWS",
        "BLOCKDB_QUERY_TIMEOUT_MS",
        "BLOCKDB_QUERY_MAX_BYTES",
        "BLOCKDB_EXECUTOR_URL",
    ]


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"BLOCKDB_URL": "sqlite:/x.db"}, "BLOCKDB_URL must be sqlite:////abs/path.db"),
        ({"BLOCKDB_URL": "postgresql:///db"}, "needs a host"),
        ({"BLOCKDB_URL": "postgresql://h:5432/"}, "needs a database name"),
        ({"BLOCKDB_URL": "sqlite:///x.db", "BLOCKDB_MAX_ROWS": "0"}, "BLOCKDB_MAX_ROWS must be"),
    ],
)
def test_bad_settings_name_their_variable(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _settings(env)
    assert words in str(refused.value)


async def test_a_server_that_goes_away_is_unavailable_until_it_returns() -> None:
    bin_dir = find_postgres_bin()
    assert bin_dir is not None, "PostgreSQL is not installed: run scripts/setup.sh"
    server = PostgresServer(bin_dir)
    server.start()
    try:
        url = parse_blockdb_url(server.url())
        store = await open_store(url)
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            await w.insert_blocks([make_block(0)])
        await store.close()
        backend = BlockDbBackend(url, max_rows=10)
        await backend.start()
        io = open_router(None, blockdb=backend)
        assert (await read(io, "block", 0))["block_number"] == 0
        server.stop_server()
        down = await io.execute("blockdb", "block", [0], {}, writes=False)
        assert isinstance(down, IoFailed), down
        assert down.kind == IoErrorKind.UNAVAILABLE
        assert down.retryable
        server.start_server()
        # The pool drops its dead connections and opens new ones.
        answers = [await io.execute("blockdb", "block", [0], {}, writes=False) for _ in range(5)]
        assert isinstance(answers[-1], IoOk), answers[-1]
        await backend.close()
    finally:
        server.stop()
