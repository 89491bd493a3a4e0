"""The store's generic ``rows`` read the chain Builders scan with, on both engines:
equality filters on checked columns, order, the row limit, refused arguments."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from chain_rows import GENESIS, OTHER_TOPIC, TOKEN, make_block

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.store import BlockStore, TooManyRows, open_store
from blockx_chain.url import parse_blockdb_url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[BlockStore]:
    opened = await open_store(parse_blockdb_url(db_url), max_rows=15)
    async with opened.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks([make_block(n, txs=3) for n in (3, 1, 2)])
    yield opened
    await opened.close()


async def test_rows_filter_by_column_equality_in_order(store: BlockStore) -> None:
    logs = await store.rows("logs", 1, 2)
    assert [(r["block_number"], r["log_index"]) for r in logs] == [
        (n, i) for n in (1, 2) for i in range(6)
    ]
    other = await store.rows("logs", 1, 3, {"topic0": OTHER_TOPIC, "transaction_index": 2})
    assert [(r["block_number"], r["log_index"]) for r in other] == [(1, 5), (2, 5), (3, 5)]
    # Hex values are compared lowercase, as they are stored.
    upper = TOKEN.upper().replace("X", "x")
    assert len(await store.rows("erc20_transfers", 2, None, {"token": upper})) == 3
    assert await store.rows("logs", 2, 2, {"topic3": None, "topic0": TRANSFER_TOPIC}) != []
    assert [t["transaction_index"] for t in await store.rows("transactions", 3)] == [0, 1, 2]
    assert [b["block_number"] for b in await store.rows("blocks", 0, 9)] == [1, 2, 3]
    assert await store.rows("transactions", 1, 3, {"to_address": None}) != []


async def test_rows_keep_the_row_limit(store: BlockStore) -> None:
    with pytest.raises(TooManyRows, match="BLOCKDB_MAX_ROWS"):
        await store.rows("logs", 1, 3)  # 18 logs, over the limit of 15
    assert len(await store.rows("logs", 1, 3, {"topic0": TRANSFER_TOPIC})) == 9


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (("chain", 1), ValueError, "table must be one of"),
        (("logs", 1, 2, {"address = address OR 1": 1}), ValueError, "has no column"),
        (("logs", 1, 2, {"log_index": "1"}), ValueError, "must be an integer"),
        (("transactions", 1, 2, {"value": "5"}), ValueError, "cannot be filtered"),
        (("logs", 1, 2, [("log_index", 1)]), TypeError, "where must be an object"),
        (("logs", 2, 1), ValueError, "below from_block"),
    ],
)
async def test_rows_refuse_bad_arguments(
    store: BlockStore, args: tuple[Any, ...], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        await store.rows(*args)
