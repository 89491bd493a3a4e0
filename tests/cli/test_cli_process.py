"""``blockx`` as a real subprocess: the README's demo, dev up, and a submission."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
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
    """`blockx demo`, the README's main command, as a newcomer runs it: every stage
    timed, backfill and live through client.backfill and client.follow, the token
    table read back from the sink, and the checks against the chain (coverage,
    totals, the reorg) passed."""
    result = subprocess.run(
        [blockx_binary(), "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for stage in ("start the cluster", "generate the chain", "ingest", "backfill", "live"):
        assert re.search(rf"✓ {stage} in \d+\.\d s", out), stage
    assert "2,000 blocks" in out
    tokens = re.findall(r"│ (TT\d) +│ 0x[0-9a-f]{40} +│ +([\d,]+) │", out)
    assert sorted(symbol for symbol, _ in tokens) == ["TT0", "TT1", "TT2"], out
    assert all(int(count.replace(",", "")) > 0 for _, count in tokens)
    assert re.search(
        r"✓ sink covers blocks 0-\d+: each written once, under its canonical hash", out
    )
    assert "✓ sink totals per token equal the block database's" in out
    assert "✓ reorg corrected: 3 blocks rewritten, sink matches chain" in out
    # The stages run the SDK's drivers, and follow reported the reorg it reconciled.
    assert "backfill — client.backfill:" in out
    assert re.search(r"client\.follow writing each block", out)
    assert re.search(r"reorg of depth 3 above block \d+: follow rewrites \d+ blocks", out), out
    assert re.search(r"head lag \(mined → rows committed\) +│ +p50 \d+ ms", out)
    assert "done in" in out
    assert "Traceback" not in out + result.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    local = LocalCluster(ROOT / "examples", chain=False)
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


def test_dev_up_runs_until_ctrl_c(tmp_path: Path) -> None:
    ports = [str(free_port()) for _ in range(7)]
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
            "--bundle-coordinator-port",
            ports[4],
            "--bundle-worker-port",
            ports[5],
            "--anvil-port",
            ports[6],
            "--blocks",
            "20",
        ],
        cwd=ROOT,
        # Its dev.toml goes to a temporary directory, not the user's ~/.config.
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
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
    assert f"bundle coordinator  127.0.0.1:{ports[4]}" in text
    assert f"chain (anvil)       http://127.0.0.1:{ports[6]}" in text
    assert "ingest following the head" in text
    assert "terminal  SUCCEEDED" in text
    # Every process that serves Prometheus says where, and serves there.
    metrics = dict(
        (line.split("(")[-1].rstrip(")\n"), line.split()[1])
        for line in seen
        if line.strip().startswith("metrics ")
    )
    assert sorted(metrics) == [
        "bundle coordinator",
        "bundle worker",
        "coordinator",
        "sync invoker",
        "worker",
    ], text
    assert metrics["coordinator"] == f"http://127.0.0.1:{ports[3]}/metrics"
    for url in metrics.values():
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"# TYPE " in response.read()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "blockx-dev: stopped" in rest
