"""BLOCKDB_URL in SQLAlchemy's forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockx_chain.url import (
    InvalidBlockDbUrl,
    InvalidWsUrl,
    PostgresUrl,
    SqliteUrl,
    describe,
    parse_blockdb_url,
    parse_ws_url,
    resolve_ws_url,
)

GOOD = [
    ("sqlite:////var/lib/chain.db", SqliteUrl(Path("/var/lib/chain.db"))),
    ("sqlite:///chain.db", SqliteUrl(Path("/work/dir/chain.db"))),
    ("sqlite:///data/chain.db", SqliteUrl(Path("/work/dir/data/chain.db"))),
    (
        "postgresql://blockx@db.internal:6543/chain",
        PostgresUrl(
            dsn="postgresql://blockx@db.internal:6543/chain",
            host="db.internal",
            port=6543,
            database="chain",
        ),
    ),
    (
        "postgres://u:secret@127.0.0.1/chain?sslmode=disable",
        PostgresUrl(
            dsn="postgres://u:secret@127.0.0.1/chain?sslmode=disable",
            host="127.0.0.1",
            port=5432,
            database="chain",
        ),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), GOOD)
def test_good_urls(raw: str, expected: object) -> None:
    assert parse_blockdb_url(raw, cwd=Path("/work/dir")) == expected


BAD = [
    ("chain.db", "no scheme"),
    ("mysql://h/db", "unknown scheme 'mysql'"),
    ("sqlite://", "no host"),
    ("sqlite://host/x.db", "no host"),
    ("sqlite:///", "names a database file"),
    ("sqlite:///x.db?mode=ro", "names a database file"),
    ("postgresql://h:port/db", "port"),
    ("postgresql://h:70000/db", "port"),
    ("postgresql:///db", "needs a host"),
    ("postgresql://h", "needs a database name"),
    ("postgresql://h/a/b", "needs a database name"),
]


@pytest.mark.parametrize(("raw", "why"), BAD)
def test_bad_urls_say_the_forms(raw: str, why: str) -> None:
    with pytest.raises(InvalidBlockDbUrl) as refused:
        parse_blockdb_url(raw)
    message = str(refused.value)
    assert message.startswith("must be sqlite:////abs/path.db, sqlite:///rel.db or postgresql://")
    assert why in message
    assert "\n" not in message


def test_describe_leaves_the_password_out() -> None:
    url = parse_blockdb_url("postgresql://u:secret@h:1/db")
    assert describe(url) == "postgresql://h:1/db"
    assert describe(SqliteUrl(Path("/a/b.db"))) == "sqlite:////a/b.db"


# CHAIN_WS_URL: the node's WebSocket for ingest's newHeads subscription.
WS = [
    # (CHAIN_WS_URL, CHAIN_RPC_URL, subscribed to)
    (None, "http://127.0.0.1:8545", "ws://127.0.0.1:8545"),
    (None, "https://eth.example.com/v2/key?x=1", "wss://eth.example.com/v2/key?x=1"),
    (None, "http://u:p@node:8545/", "ws://u:p@node:8545/"),
    (
        "wss://ws.example.com/v2/key",
        "https://eth.example.com/v2/key",
        "wss://ws.example.com/v2/key",
    ),
    (" ws://node:8546 ", "http://node:8545", "ws://node:8546"),
    ("none", "http://127.0.0.1:8545", None),
    ("NONE", "http://127.0.0.1:8545", None),
]


@pytest.mark.parametrize(("ws", "rpc", "expected"), WS)
def test_the_websocket_is_given_or_derived_from_the_http_url(
    ws: str | None, rpc: str, expected: str | None
) -> None:
    assert resolve_ws_url(ws, rpc) == expected


@pytest.mark.parametrize(
    "raw", ["http://node:8545", "ws://", "ws://node:99999", "node:8546", "", "off"]
)
def test_a_websocket_url_that_is_none_of_the_forms_is_refused(raw: str) -> None:
    with pytest.raises(InvalidWsUrl, match="must be a ws:// or wss:// URL, or none"):
        parse_ws_url(raw)
