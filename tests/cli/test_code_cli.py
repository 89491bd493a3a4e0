"""``blockx code`` reads the code kept in a real SQLite sink: a block's code, one
chain's of a block several wrote, a task's, a digest's, one module; a block
written without code, a block nobody wrote and a sink that is not there are one
line each, and the sink is not made."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sink_cli import blockx_offline
from sink_layouts import make_sink_at

from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url

SOURCES = {"fns": "def f(block):\n    return {'v': 1}\n", "helpers": "SCALE = 10\n"}
DIGEST = "ab" * 32


def _sink(url: str) -> None:
    async def write() -> None:
        sink = await open_sink(parse_blockdb_url(url))
        try:
            for chain_id, task in ((1, "t-1"), (8453, "t-2")):
                await sink.replace_blocks(
                    "vol",
                    chain_id,
                    [(5, f"0x5{chain_id}", [{"v": 1}])],
                    code_epoch=3,
                    task_id=task,
                    now_ms=7,
                    code_digest=DIGEST,
                    code_sources=SOURCES,
                )
            # A writer that gives no code.
            await sink.replace_blocks("vol", 1, [(6, "0x6", [])], task_id="t-3")
        finally:
            await sink.close()

    asyncio.run(write())


def test_code_shows_a_blocks_tasks_and_digests_code(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sink.db"
    _sink(url)
    status, output = blockx_offline("code", "vol", "5", "--sink-db", url, tmp_path=tmp_path)
    assert status == 2
    assert "written for chains 1, 8453: pass --chain-id" in output

    status, output = blockx_offline(
        "code", "vol", "5", "--chain-id", "8453", "--sink-db", url, tmp_path=tmp_path
    )
    assert status == 0, output
    assert "block 5 of vol (chain 8453), hash 0x58453" in output
    assert "written by task t-2 (block write to vol), code epoch 3" in output
    assert f"code {DIGEST}" in output
    assert "# ---- fns.py ----\ndef f(block):\n    return {'v': 1}\n# ---- helpers.py" in output

    status, output = blockx_offline(
        "code",
        "--task",
        "t-1",
        "--module",
        "helpers",
        "--json",
        "--sink-db",
        url,
        tmp_path=tmp_path,
    )
    assert status == 0, output
    shown = json.loads(output)
    assert shown["block"] is None
    assert shown["code"]["sources"] == {"helpers": "SCALE = 10\n"}
    assert (shown["code"]["task_id"], shown["code"]["code_epoch"]) == ("t-1", 3)

    status, output = blockx_offline(
        "code", "vol", "5", "--chain-id", "1", "--json", "--sink-db", url, tmp_path=tmp_path
    )
    shown = json.loads(output)
    assert (shown["block"]["task_id"], shown["block"]["block_hash"]) == ("t-1", "0x51")
    assert shown["code"]["sources"] == SOURCES

    status, output = blockx_offline("code", "--digest", DIGEST, "--sink-db", url, tmp_path=tmp_path)
    assert status == 0, output
    assert "written by task" not in output
    assert "SCALE = 10" in output


def test_code_says_in_one_line_what_it_cannot_show(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sink.db"
    _sink(url)
    for argv, status, said in (
        (["vol", "6"], 1, "written by task 't-3' (code epoch 0), but"),
        (["vol", "7"], 1, "no block 7 of table 'vol'"),
        (["--task", "t-9"], 1, "keeps no code for task 't-9'"),
        (["--digest", "cd" * 32], 1, "holds no code of digest"),
        (["--task", "t-1", "--module", "nope"], 1, "has no module 'nope' (modules: fns, helpers)"),
        (["vol"], 2, "name what to show"),
        (["vol", "5", "--task", "t-1"], 2, "name what to show"),
        (["1vol", "5"], 1, "is not a usable name"),
    ):
        got, output = blockx_offline("code", *argv, "--sink-db", url, tmp_path=tmp_path)
        assert (got, said in output) == (status, True), output
    missing = tmp_path / "typo.db"
    got, output = blockx_offline(
        "code", "vol", "5", "--sink-db", f"sqlite:///{missing}", tmp_path=tmp_path
    )
    assert (got, "no sink database at" in output) == (3, True), output
    assert not missing.exists()


def test_code_of_a_sink_whose_rows_do_not_say_their_chain_is_refused_unchanged(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/sink.db"
    asyncio.run(make_sink_at(url, 1, [(1, "0x1", [10])]))
    before = (tmp_path / "sink.db").read_bytes()
    got, output = blockx_offline("code", "volume", "1", "--sink-db", url, tmp_path=tmp_path)
    assert (got, "written before sink rows carried their chain" in output) == (1, True), output
    assert (tmp_path / "sink.db").read_bytes() == before
