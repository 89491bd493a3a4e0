"""Start and stop a local anvil (Foundry's Ethereum node) for tests and the demo.

The binary comes from the npm package ``@foundry-rs/anvil-linux-amd64`` pinned in the
repository's package.json (``npm ci``); ``ANVIL_BIN`` or ``PATH`` may name another.
anvil always runs with ``--hardfork cancun --prune-history 512``: the default
hardfork makes mining quadratic in the chain length, the default history writes
every block's state to disk, and a bare ``--prune-history`` keeps only the latest
state (reads at an older block would fail).

The process is a plain ``subprocess.Popen`` so it does not belong to any event loop:
a test fixture can start it once and tests on their own loops can use it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

_NPM_BINARY: Final = Path("node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil")
PRUNE_HISTORY: Final = 512
DEFAULT_CHAIN_ID: Final = 31337
DEFAULT_GENESIS_TIMESTAMP: Final = 1_700_000_000


class AnvilNotFound(RuntimeError):
    pass


class AnvilFailed(RuntimeError):
    pass


def find_anvil() -> Path:
    """``ANVIL_BIN``, else the npm binary under the repository root (searched upward
    from this package and from the working directory), else ``anvil`` on PATH."""
    explicit = os.environ.get("ANVIL_BIN")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise AnvilNotFound(f"ANVIL_BIN={explicit} is not an executable file")
        return path
    for start in (Path(__file__).resolve(), Path.cwd().resolve()):
        for folder in (start, *start.parents):
            candidate = folder / _NPM_BINARY
            if candidate.is_file():
                return candidate
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    raise AnvilNotFound(
        "anvil not found: run `npm ci` at the repository root (it installs "
        "@foundry-rs/anvil-linux-amd64), or set ANVIL_BIN"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True, kw_only=True)
class AnvilOptions:
    chain_id: int = DEFAULT_CHAIN_ID
    # The genesis block's timestamp; the devnet stamps later blocks from it.
    timestamp: int = DEFAULT_GENESIS_TIMESTAMP
    accounts: int = 20
    # None: mine only on request (--no-mining); a number: anvil mines every so many seconds.
    block_time_s: float | None = None
    port: int | None = None
    extra_args: tuple[str, ...] = ()


class Anvil:
    """``with Anvil() as node: node.url`` — a running anvil on 127.0.0.1."""

    def __init__(self, options: AnvilOptions | None = None, binary: Path | None = None) -> None:
        self.options = options or AnvilOptions()
        self.binary = binary or find_anvil()
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self, port: int) -> list[str]:
        opts = self.options
        mining = (
            ["--no-mining"]
            if opts.block_time_s is None
            else ["--block-time", f"{opts.block_time_s}"]
        )
        return [
            str(self.binary),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--hardfork",
            "cancun",
            "--prune-history",
            str(PRUNE_HISTORY),
            "--chain-id",
            str(opts.chain_id),
            "--timestamp",
            str(opts.timestamp),
            "--accounts",
            str(opts.accounts),
            *mining,
            *opts.extra_args,
        ]

    def start(self, timeout_s: float = 15.0) -> None:
        # A free port can be taken between the probe and anvil's bind: try a few.
        attempts = 1 if self.options.port is not None else 3
        for attempt in range(attempts):
            port = self.options.port or free_port()
            self._log = tempfile.NamedTemporaryFile(prefix="anvil-", suffix=".log")  # noqa: SIM115
            self._process = subprocess.Popen(
                self.args(port),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C goes to its owner, which stops it
            )
            self.port = port
            try:
                self._wait_ready(timeout_s)
                return
            except AnvilFailed:
                self.stop()
                if attempt == attempts - 1:
                    raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise AnvilFailed(
                    f"anvil exited with {self._process.returncode} at start: {self.log_tail()}"
                )
            try:
                self.request_sync("eth_chainId", [])
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.02)
        raise AnvilFailed(f"anvil did not answer on {self.url} in {timeout_s} s")

    def request_sync(self, method: str, params: list[object]) -> object:
        """One blocking JSON-RPC request (start-up checks and sync fixtures)."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        request = urllib.request.Request(
            self.url, body.encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            answer = json.loads(response.read())
        if "error" in answer:
            raise AnvilFailed(f"{method}: {answer['error']}")
        return answer.get("result")

    def log_tail(self, limit: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes()[-limit:].decode(errors="replace")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
