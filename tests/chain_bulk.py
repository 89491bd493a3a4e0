"""A block database of many rows, written straight into SQLite with executemany
(the store makes the schema and the chain row; the rows skip ingest's checks, which
they obey anyway): for tests and benchmarks of long scans."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from chain_rows import GENESIS, TOKEN, address, block_hash, h32

from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url

_BLOCKS = (
    "block_number, block_hash, parent_hash, timestamp, miner, gas_used, gas_limit, "
    "base_fee_per_gas, transaction_count"
)
_TRANSFERS = (
    "block_number, log_index, transaction_index, transaction_hash, block_hash, token, "
    "from_address, to_address, value"
)


def transfer_value(number: int, index: int) -> str:
    return str(10**20 + number * 1000 + index)


def _blocks(count: int, missing: Collection[int]) -> Iterator[tuple[Any, ...]]:
    for n in range(count):
        if n not in missing:
            parent = block_hash(n - 1) if n else "0x" + "00" * 32
            yield (n, block_hash(n), parent, 1_700_000_000 + 12 * n, address(0xBEEF), 0, 1, 7, 0)


def _transfers(count: int, per_block: int, missing: Collection[int]) -> Iterator[tuple[Any, ...]]:
    for n in range(count):
        if n in missing:
            continue
        hash_ = block_hash(n)
        for i in range(per_block):
            yield (
                n,
                i,
                i,
                h32(0x7A, n, i),
                hash_,
                TOKEN,
                address(1 + i % 7),
                address(100 + i % 5),
                transfer_value(n, i),
            )


async def bulk_chain(
    path: Path, blocks: int, transfers_per_block: int, *, missing: Collection[int] = ()
) -> None:
    """Blocks ``0..blocks-1`` at ``path`` (but ``missing``), each with
    ``transfers_per_block`` erc20_transfers rows; the last block is the head."""
    store = await open_store(parse_blockdb_url(f"sqlite:///{path}"))
    try:
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
    finally:
        await store.close()
    missing = frozenset(missing)
    db = sqlite3.connect(path)
    try:
        with db:
            db.executemany(
                f"INSERT INTO blocks ({_BLOCKS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _blocks(blocks, missing),
            )
            db.executemany(
                f"INSERT INTO erc20_transfers ({_TRANSFERS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _transfers(blocks, transfers_per_block, missing),
            )
            last = blocks - 1
            db.execute(
                "UPDATE chain SET head_number = ?, head_hash = ?, finalized_number = ?, epoch = 0",
                (last, block_hash(last), last),
            )
    finally:
        db.close()
