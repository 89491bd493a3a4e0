"""A sink as an older BlockX left it, on either engine, for tests of what opening
it with this BlockX does: the writers' tables of that layout and one stamped
table, ``volume`` (an integer ``v`` per row, the default key), with its rows and
ledger entries, statement for statement as that BlockX made them.

Layout 0: the writers' indexes named ``ux_`` + digest, no ``_blockx_sink``.
Layout 1: the indexes under ``_blockx_``, ``_blockx_sink`` at version 1; rows and
ledger entries carry no chain id.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Sequence

import asyncpg

from blockx_chain.sink.jobs import job_statements
from blockx_chain.sink.schema import index_name
from blockx_chain.url import SqliteUrl, parse_blockdb_url

TABLE = "volume"
KEY = ["block_number", "row_index"]


def _statements(
    postgres: bool, layout: int, blocks: Sequence[tuple[int, str, Sequence[int]]]
) -> list[tuple[str, tuple[object, ...]]]:
    big = "BIGINT" if postgres else "INTEGER"
    made: list[tuple[str, tuple[object, ...]]] = [
        (
            "CREATE TABLE _blockx_columns (table_name TEXT NOT NULL, column_name TEXT NOT NULL, "
            "column_type TEXT NOT NULL, PRIMARY KEY (table_name, column_name))",
            (),
        ),
        (
            f"CREATE TABLE _blockx_written (table_name TEXT NOT NULL, block_number {big} NOT NULL, "
            f"block_hash TEXT NOT NULL, code_epoch {big} NOT NULL, task_id TEXT NOT NULL, "
            f"written_at_ms {big} NOT NULL, PRIMARY KEY (table_name, block_number))",
            (),
        ),
        *((statement, ()) for statement in job_statements(postgres)),
        (
            f'CREATE TABLE "{TABLE}" ("block_number" {big}, "block_hash" TEXT, '
            f'"code_epoch" {big}, "row_index" {big}, "v" {big})',
            (),
        ),
        (
            f'CREATE UNIQUE INDEX "{index_name("ux", TABLE, KEY, legacy=layout < 1)}" '
            f'ON "{TABLE}" ("block_number", "row_index")',
            (),
        ),
    ]
    if layout >= 1:
        made += [
            ("CREATE TABLE _blockx_sink (identity TEXT NOT NULL, version INTEGER NOT NULL)", ()),
            ("INSERT INTO _blockx_sink (identity, version) VALUES (?, ?)", (str(uuid.uuid4()), 1)),
        ]
    for name in ("block_number", "block_hash", "code_epoch", "row_index", "v"):
        kind = "TEXT" if name == "block_hash" else "INTEGER"
        made.append(("INSERT INTO _blockx_columns VALUES (?, ?, ?)", (TABLE, name, kind)))
    for number, block_hash, values in blocks:
        ledger = "INSERT INTO _blockx_written VALUES (?, ?, ?, 0, 'old', 0)"
        made.append((ledger, (TABLE, number, block_hash)))
        for index, value in enumerate(values):
            made.append(
                (
                    f'INSERT INTO "{TABLE}" VALUES (?, ?, 0, ?, ?)',
                    (number, block_hash, index, value),
                )
            )
    return made


async def make_sink_at(
    db_url: str, layout: int, blocks: Sequence[tuple[int, str, Sequence[int]]]
) -> None:
    """A sink of ``layout`` at ``db_url`` (an empty database) whose ``volume`` table
    holds, for each ``(number, hash, values)`` of ``blocks``, one row per value."""
    url = parse_blockdb_url(db_url)
    if isinstance(url, SqliteUrl):
        conn = sqlite3.connect(str(url.path))
        for statement, params in _statements(False, layout, blocks):
            conn.execute(statement, params)
        conn.commit()
        conn.close()
        return
    pg = await asyncpg.connect(db_url)
    try:
        for statement, params in _statements(True, layout, blocks):
            numbered = statement
            for i in range(statement.count("?")):
                numbered = numbered.replace("?", f"${i + 1}", 1)
            await pg.execute(numbered, *params)
    finally:
        await pg.close()
