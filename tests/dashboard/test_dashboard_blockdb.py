"""The Jobs page's line on the block database: whole blocks, or only the logs of the
filter a selective ingest (``--logs``) made it with; a missing database is a
problem line, and is not created."""

from __future__ import annotations

from pathlib import Path

import msgspec

from blockx_chain.schema import TRANSFER_TOPIC, LogFilterRecord
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.dashboard.app import Dashboard
from blockx_cli.dashboard.config import DashboardConfig
from blockx_cli.dashboard.jobs_source import jobs_page
from blockx_cli.dashboard.views import BlockDbState
from blockx_client import Client

TOKEN = "0x" + "70" * 20
GENESIS = "0x" + "ab" * 32
CONFIG = DashboardConfig(etcd_endpoints=("127.0.0.1:1",))


async def _made(path: Path, record: LogFilterRecord | None) -> str:
    url = f"sqlite:///{path}"
    store = await open_store(parse_blockdb_url(url))
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        if record is not None:
            await w.set_log_filter(record)
        await w.set_chain(head_number=40, head_hash=GENESIS, finalized_number=28, epoch=0)
    await store.close()
    return url


async def test_the_jobs_page_shows_what_the_block_database_holds(tmp_path: Path) -> None:
    record = LogFilterRecord(addresses=(TOKEN,), topic0s=(TRANSFER_TOPIC,), from_block=7)
    selective = await _made(tmp_path / "logs.db", record)
    page = await jobs_page(msgspec.structs.replace(CONFIG, blockdb_url=selective))
    assert page.blockdb == BlockDbState(
        database=selective,
        holds="logs",
        head=40,
        finalized=28,
        epoch=0,
        addresses=(TOKEN,),
        topic0s=(TRANSFER_TOPIC,),
        from_block=7,
    )
    dashboard = Dashboard(CONFIG, Client)
    html = dashboard.templates.get_template("jobs.html").render(
        refresh_s=5.0, page="jobs", view=page, api="/api/jobs"
    )
    assert (
        f"holds only the logs of {TOKEN} with topic0 {TRANSFER_TOPIC}, from block 7 "
        "(blockx chain ingest --logs): no transactions"
    ) in html
    whole = await _made(tmp_path / "full.db", None)
    page = await jobs_page(msgspec.structs.replace(CONFIG, blockdb_url=whole))
    assert page.blockdb is not None
    assert (page.blockdb.holds, page.blockdb.head, page.blockdb.addresses) == (
        "whole blocks",
        40,
        (),
    )
    html = dashboard.templates.get_template("jobs.html").render(
        refresh_s=5.0, page="jobs", view=page, api="/api/jobs"
    )
    assert "holds whole blocks" in html
    missing = tmp_path / "typo.db"
    page = await jobs_page(msgspec.structs.replace(CONFIG, blockdb_url=f"sqlite:///{missing}"))
    assert page.blockdb is None
    assert (page.problems[-1].source, page.problems[-1].error) == (
        f"block database sqlite:///{missing}",
        f"no block database at {missing}",
    )
    assert not missing.exists()
