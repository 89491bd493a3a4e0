"""A Worker with a malformed SINK_DB_URL refuses to start, in one line naming it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import free_port


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
