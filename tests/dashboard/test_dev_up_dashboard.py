"""``blockx dev up`` starts the web dashboard with the rest of the cluster, prints
its URL with the other endpoints, and stops it on Ctrl-C; ``blockx dashboard
--help`` shows its defaults."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from support import free_port
from typer.testing import CliRunner

from blockx_cli.app import app

BLOCKX = str(Path(sys.executable).parent / "blockx")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_dev_up_serves_the_dashboard_on_the_port_asked(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "greet.py").write_text("def greet(name):\n    return f'hi {name}'\n")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BLOCKX_", "ETCD_"))},
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "FUNCTIONS_DIR": str(functions),
        "COLUMNS": "200",
    }
    proc = subprocess.Popen(
        [BLOCKX, "dev", "up", "--no-chain", "--executors", "1", "--dashboard-port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            seen.append(line)
            if "Press Ctrl-C to stop." in line or time.monotonic() > deadline:
                break
        banner = "".join(seen)
        url = f"http://127.0.0.1:{port}/"
        assert re.search(rf"^  dashboard +{re.escape(url)} ", banner, re.MULTILINE), banner
        worker = re.search(r"^  worker +(\S+)", banner, re.MULTILINE)
        assert worker is not None, banner
        workers = _get_json(url + "api/workers")
        assert worker.group(1) in {w["worker_addr"] for w in workers["workers"]}
        placement = _get_json(url + "api/placement")
        assert placement["problems"] == []
        # Ctrl-C at the terminal: the dashboard stops with everything else.
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "Traceback" not in banner + rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_dashboard_help_shows_the_defaults() -> None:
    result = CliRunner().invoke(app, ["dashboard", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "[default: 127.0.0.1]" in result.output
    assert "[default: 8941]" in result.output
    assert "BLOCKX_DASHBOARD_PORT" in result.output


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [BLOCKX, "--etcd", "127.0.0.1:1", "dashboard", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "COLUMNS": "200"},
        )
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"port {port} on 127.0.0.1 is already in use (--port)" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
