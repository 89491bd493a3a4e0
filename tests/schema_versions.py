"""A block database as an older BlockX left it: made by the migrations up to a
version, on either engine, for tests of what opening it with this BlockX does."""

from __future__ import annotations

import sqlite3

import asyncpg

from blockx_chain.schema import MIGRATIONS, Engine
from blockx_chain.url import parse_blockdb_url


async def make_database_at(db_url: str, version: int, *, extra_table: str | None = None) -> None:
    """An empty block database of schema ``version`` at ``db_url``, plus a table of
    a user's named ``extra_table`` when given."""
    engine = Engine.SQLITE if db_url.startswith("sqlite") else Engine.POSTGRES
    statements = [s for migrate in MIGRATIONS[:version] for s in migrate(engine)]
    if extra_table is not None:
        statements.append(f"CREATE TABLE {extra_table} (x INTEGER)")
    if engine is Engine.SQLITE:
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
        conn.close()
        return
    pg = await asyncpg.connect(db_url)
    try:
        await pg.execute("CREATE TABLE blockx_schema (version INTEGER NOT NULL)")
        await pg.execute(f"INSERT INTO blockx_schema (version) VALUES ({version})")
        for statement in statements:
            await pg.execute(statement)
    finally:
        await pg.close()
