"""``blockx-dev`` in the background, for ``blockx demo`` and the tests.

It runs as its own process (``python -m blockx_cli.devcluster``) so that its
children's logs go to a file and its signals stay its own; it announces where
its chain is as soon as anvil answers (``BLOCKX_DEV_CHAIN {json}``,
``wait_chain``), then its endpoints once everything serves (``BLOCKX_DEV_READY
{json}``, ``wait_ready``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blockx_cli.devcluster.ready import CHAIN_READY, READY


class LocalCluster:
    """``blockx-dev --no-smoke --ready-json`` in the background, with its logs in a file,
    on free ports, writing no dev.toml (whoever starts it reads the ready line) and
    running no dashboard.

    With ``chain`` it runs anvil, the databases and the bundle cluster too, with an
    empty chain and no ingest unless ``feed`` (whoever uses it drives the chain)."""

    def __init__(
        self, examples: Path, executors: int = 2, *, chain: bool = True, feed: bool = False
    ) -> None:
        self.started = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix="blockx-demo-"))
        self.log = self.workdir / "cluster.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "blockx_cli.devcluster",
                "--proxy-socket",
                str(self.workdir / "proxy.sock"),
                "--executors",
                str(executors),
                "--examples",
                str(examples),
                # Named, so a FUNCTIONS_DIR in the environment does not replace them.
                "--functions",
                str(examples / "functions"),
                "--no-smoke",
                "--no-dev-config",
                # A program drives this cluster: nobody looks at a dashboard.
                "--no-dashboard",
                "--ready-json",
                "--log-file",
                str(self.log),
                *([] if chain else ["--no-chain"]),
                *([] if feed else ["--no-feed"]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # What it printed besides the two JSON lines (its start's progress, errors).
        self._seen: list[str] = []
        self._chain: dict[str, Any] | None = None
        self._ready: dict[str, Any] | None = None

    def wait_chain(self, timeout_s: float = 60) -> dict[str, Any]:
        """The chain's addresses (``rpc_url``, ``block_db_url``, ``sink_db_url``) as
        soon as anvil and the databases are up, while the BlockX processes start."""
        deadline = time.monotonic() + timeout_s
        while self._chain is None:
            self._read_line(deadline)
        return self._chain

    def wait_ready(self, timeout_s: float = 60) -> dict[str, Any]:
        """Every endpoint, once every process serves (``Endpoints`` as a dict)."""
        deadline = time.monotonic() + timeout_s
        while self._ready is None:
            self._read_line(deadline)
        return self._ready

    def _read_line(self, deadline: float) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.startswith(READY):
            self._ready = json.loads(line[len(READY) :])
        elif line.startswith(CHAIN_READY):
            self._chain = json.loads(line[len(CHAIN_READY) :])
        elif line:
            self._seen.append(line)
        if not line or time.monotonic() > deadline:
            said = "".join(self._seen[-20:])
            raise RuntimeError(f"the local cluster did not start:\n{said}{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return "".join(self.log.read_text().splitlines(keepends=True)[-20:])
        except OSError:
            return ""

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return self.proc.returncode
