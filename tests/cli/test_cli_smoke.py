"""The console scripts are installed and answer; blockx-dev runs its smoke task."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support import free_port
from typer.testing import CliRunner

from blockx_cli.app import app


def test_version_flag() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("blockx 0.")


def test_installed_blockx_script_lists_versions() -> None:
    blockx = shutil.which("blockx")
    assert blockx is not None
    result = subprocess.run([blockx, "version-info"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "blockx-client 0." in result.stdout
    assert "blockx-proto 0." in result.stdout


def test_dev_cluster_runs_the_demo_task(tmp_path: Path) -> None:
    """The README's demo command, end to end: etcd, the coordinator, a worker with its
    executors, the example task through ReserveWorkerSlot/SubmitTask/WatchTasks."""
    dev = shutil.which("blockx-dev")
    assert dev is not None
    result = subprocess.run(
        [
            dev,
            "--once",
            "--coordinator-port",
            str(free_port()),
            "--worker-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--sync-invoker-port",
            str(free_port()),
            "--bundle-coordinator-port",
            str(free_port()),
            "--bundle-worker-port",
            str(free_port()),
            "--anvil-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        # Its dev.toml goes to a temporary directory, not the user's ~/.config.
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BlockX dev cluster is up" in result.stdout
    assert "terminal  SUCCEEDED" in result.stdout
    assert 'ReturnValueResultHandler: ["hello, ct2","hello, blockx"]' in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("blockx-dev: stopped")
