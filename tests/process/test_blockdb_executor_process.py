"""A function querying ``io.blockdb_executor`` on a real ``blockx-syncinvoker``, over a
SQLite file and over PostgreSQL as a read-only role."""

from __future__ import annotations

from pathlib import Path

import pytest
from chain_rows import TOKEN, seed_chain
from postgres import read_only_role
from processes import SyncInvokerProcess

FUNCTIONS = '''
from blockx_executor import IoError, io

async def token_totals(low, high):
    """Transfers and their value per token over a block range, summed in SQL."""
    return await io.blockdb_executor.query(
        "SELECT token, count(*) AS transfers, sum(CAST(value AS NUMERIC)) AS total "
        "FROM erc20_transfers WHERE block_number BETWEEN ? AND ? GROUP BY token",
        [low, high],
        through_block=high,
    )

async def refused(sql):
    try:
        await io.blockdb_executor.query(sql)
    except IoError as exc:
        return {"kind": exc.kind, "message": exc.message}
    return None
'''


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    d.mkdir()
    (d / "sqlfns.py").write_text(FUNCTIONS)
    return d


async def test_a_function_sums_in_sql_on_a_real_sync_invoker(
    db_url: str, functions_dir: Path, tmp_path: Path
) -> None:
    await seed_chain(db_url, 12)
    env = {"FUNCTIONS_DIR": str(functions_dir), "BLOCKDB_URL": db_url}
    if db_url.startswith("postgresql"):
        env["BLOCKDB_EXECUTOR_URL"] = (await read_only_role(db_url)).dsn
    process = SyncInvokerProcess(env, tmp_path / "invoker.log")
    try:
        await process.wait_ready()
        (totals,) = await process.invoke("token_totals", [2, 4])
        write = await process.invoke("refused", ["DELETE FROM blocks"])
    finally:
        assert process.stop() == 0
    # make_block: two transfers of TOKEN per block, of 2**200 + n each.
    assert totals["token"] == TOKEN
    assert totals["transfers"] == 6
    assert int(float(totals["total"])) == pytest.approx(6 * 2**200, rel=1e-12)
    assert write["kind"] == "BAD_REQUEST"
    assert "DELETE statement is refused" in write["message"]
    output = process.output()
    assert "Traceback" not in output
    assert "io.blockdb_executor queries" in output
