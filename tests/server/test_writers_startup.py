"""A Worker with a malformed SINK_DB_URL refuses to start, in one line naming it;
SINK_WRITE_CHUNK_ROWS is read with it, and a bad value is named."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import free_port

from blockx_chain.url import parse_blockdb_url
from blockx_server.io.config import SinkSettings
from blockx_server.runtime.env import ConfigErrors
from blockx_server.worker.config import BLOCK_WORKER, load_worker_config


@pytest.mark.parametrize("program", ["blockx-worker", "blockx-bundle-worker"])
def test_a_malformed_sink_db_url_refuses_start_up_in_one_line(program: str, tmp_path: Path) -> None:
    binary = shutil.which(program)
    assert binary is not None
    done = subprocess.run(
        [binary],
        env={
            **os.environ,
            "WORKER_LISTEN": f"127.0.0.1:{free_port()}",
            "BLOCKX_LOG_LEVEL": "ERROR",
            "FUNCTIONS_DIR": str(tmp_path),
            "SINK_DB_URL": "mysql://h/db",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{program}: invalid configuration: SINK_DB_URL must be sqlite:")


def test_sink_write_chunk_rows_is_read_and_a_bad_value_is_named(tmp_path: Path) -> None:
    base = {"FUNCTIONS_DIR": str(tmp_path), "SINK_DB_URL": "sqlite:///sink.db"}
    url = parse_blockdb_url("sqlite:///sink.db")
    assert load_worker_config(BLOCK_WORKER, base).sink == SinkSettings(
        url=url, write_chunk_rows=10_000
    )
    chosen = load_worker_config(BLOCK_WORKER, {**base, "SINK_WRITE_CHUNK_ROWS": "500"})
    assert chosen.sink == SinkSettings(url=url, write_chunk_rows=500)
    assert load_worker_config(BLOCK_WORKER, {"FUNCTIONS_DIR": str(tmp_path)}).sink is None
    with pytest.raises(ConfigErrors, match="SINK_WRITE_CHUNK_ROWS must be >= 1"):
        load_worker_config(BLOCK_WORKER, {**base, "SINK_WRITE_CHUNK_ROWS": "0"})
    with pytest.raises(ConfigErrors, match="SINK_WRITE_CHUNK_ROWS must be <= 100000"):
        load_worker_config(BLOCK_WORKER, {**base, "SINK_WRITE_CHUNK_ROWS": "100001"})
    assert load_worker_config(
        BLOCK_WORKER, {**base, "SINK_WRITE_CHUNK_ROWS": "100000"}
    ).sink == SinkSettings(url=url, write_chunk_rows=100_000)
