"""``blockx`` as a real subprocess: the README's demo, dev up, and a submission."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port

from blockx_cli.devcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


def blockx_binary() -> str:
    binary = shutil.which("blockx")
    assert binary is not None
    return binary


def test_demo_end_to_end() -> None:
    """`blockx demo`, the README's main command, as a newcomer runs it."""
    result = subprocess.run(
        [blockx_binary(), "demo"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "starting a local cluster" in out
    assert "precheck block_stats(number): ok" in out
    assert "24 tasks" in out
    assert out.count("SUCCEEDED") >= 24
    assert "done in" in out
    assert "Traceback" not in out + result.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    local = LocalCluster(ROOT / "examples")
    try:
        yield local.wait_ready()
    finally:
        local.stop()


def test_submit_wait_as_a_subprocess(cluster: dict[str, str]) -> None:
    env = {**os.environ, "BLOCKX_COORDINATOR": cluster["coordinator"]}
    result = subprocess.run(
        [blockx_binary(), "submit", "examples/tasks/hello_world.json", "--wait"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "SUCCEEDED" in result.stdout


def test_bad_flags_are_a_usage_error_without_traceback() -> None:
    result = subprocess.run(
        [blockx_binary(), "submit", "--call", "not json", "--function", "f"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "is not JSON" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_dev_up_runs_until_ctrl_c() -> None:
    ports = [str(free_port()) for _ in range(4)]
    proc = subprocess.Popen(
        [
            blockx_binary(),
            "dev",
            "up",
            "--coordinator-port",
            ports[0],
            "--worker-port",
            ports[1],
            "--sync-invoker-port",
            ports[2],
            "--metrics-port",
            ports[3],
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        seen.append(line)
        if "Press Ctrl-C to stop." in line or time.monotonic() > deadline:
            break
    text = "".join(seen)
    assert "BlockX dev cluster is up" in text, text
    assert "terminal  SUCCEEDED" in text
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "blockx-dev: stopped" in rest
