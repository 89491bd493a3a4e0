"""``blockx dev up`` as a newcomer runs it: ``.venv/bin/blockx`` by absolute path with
the venv's bin off PATH, a directory holding only function modules, free ports, and
``blockx`` in another shell finding the cluster with no exports (``dev.toml``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import children_of, proc_stat
from typer.testing import CliRunner

from blockx_chain.devnet import find_anvil
from blockx_cli.app import app
from blockx_client import Client, ConnectError, SyncClient
from blockx_server.etcd.local import find_etcd_binary

VENV_BIN = Path(sys.executable).parent
BLOCKX = str(VENV_BIN / "blockx")
READY_LINE = "Press Ctrl-C to stop."


def _bare_path() -> str:
    """PATH without the virtual environment's bin directory."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if Path(d) != VENV_BIN]
    return os.pathsep.join(kept or ["/usr/bin", "/bin"])


# What a fresh shell has none of.
SHELL_VARIABLES = ("BLOCKX_", "ETCD_", "PROXY_", "FUNCTIONS_DIR", "XDG_CONFIG")


def _shell_env(home: Path, **extra: str) -> dict[str, str]:
    """A fresh shell's environment: no BlockX variables, HOME in a temporary directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SHELL_VARIABLES)}
    return {**env, "HOME": str(home), "PATH": _bare_path(), "COLUMNS": "200", **extra}


class DevUp:
    """``blockx dev up`` in its own process group, as a terminal runs it."""

    def __init__(self, env: dict[str, str], *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [BLOCKX, "dev", "up", "--no-chain", "--executors", "1", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def wait_for(self, marker: str, timeout_s: float = 90) -> str:
        assert self.proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stdout:
            seen.append(line)
            if marker in line or time.monotonic() > deadline:
                break
        text = "".join(seen)
        assert marker in text, text
        return text

    def ctrl_c(self) -> tuple[int, str]:
        """SIGINT to the whole process group, as Ctrl-C at a terminal sends it."""
        os.killpg(self.proc.pid, signal.SIGINT)
        rest, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    """Only function modules: no tasks/, no memory_seed.json."""
    folder = tmp_path / "my_functions"
    folder.mkdir()
    (folder / "greet.py").write_text("def greet(name):\n    return f'hi {name}'\n")
    return folder


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def _refused(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


def _blockx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BLOCKX, *args], env=env, capture_output=True, text=True, timeout=60, cwd="/"
    )


@pytest.fixture
def running(functions_dir: Path, home: Path, tmp_path: Path) -> Iterator[tuple[DevUp, str]]:
    """dev up serving ``functions_dir`` through FUNCTIONS_DIR, from a directory with no
    examples/, started by absolute path with the venv's bin off PATH."""
    env = _shell_env(home, FUNCTIONS_DIR=str(functions_dir))
    dev = DevUp(env, cwd=tmp_path)
    try:
        yield dev, dev.wait_for(READY_LINE)
    finally:
        dev.kill()


def test_dev_up_serves_a_functions_dir_and_another_shell_finds_it(
    running: tuple[DevUp, str], home: Path, functions_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, banner = running
    assert f"functions from {functions_dir}" in banner
    assert "Traceback" not in banner
    config_file = home / ".config" / "blockx" / "dev.toml"
    written = tomllib.loads(config_file.read_text())
    etcd, coordinator = written["ETCD_ENDPOINTS"], written["BLOCKX_COORDINATOR"]
    sync_invoker, proxy_socket = written["BLOCKX_SYNC_INVOKER"], written["PROXY_SOCKET_PATH"]
    assert f"export ETCD_ENDPOINTS={etcd}" in banner
    assert f"export BLOCKX_COORDINATOR={coordinator}" in banner
    # Free ports: never the fixed defaults of before, nor Prometheus' and node_exporter's.
    ports = {int(addr.rsplit(":", 1)[1]) for addr in (etcd, coordinator, sync_invoker)}
    assert ports.isdisjoint({2379, 8080, 9090, 9091, 9100})

    # Another shell, no exports: the CLI reads dev.toml.
    shell = _shell_env(home)
    workers = _blockx(shell, "workers", "--json")
    assert workers.returncode == 0, workers.stderr
    assert len(json.loads(workers.stdout)) == 1, workers.stdout
    invoked = _blockx(shell, "invoke", "greet", '"newcomer"', "--json")
    assert invoked.returncode == 0, invoked.stdout + invoked.stderr
    assert "hi newcomer" in invoked.stdout

    # The environment wins over the file, and a flag over the environment.
    dead = f"127.0.0.1:{_free_port()}"
    overridden = _blockx({**shell, "ETCD_ENDPOINTS": dead}, "workers", "--json")
    assert overridden.returncode == 3, overridden.stdout + overridden.stderr
    assert dead in overridden.stderr
    flagged = _blockx({**shell, "ETCD_ENDPOINTS": dead}, "--etcd", etcd, "workers", "--json")
    assert flagged.returncode == 0, flagged.stderr

    # The SDK reads it too (this process, made another shell).
    for name in list(os.environ):
        if name.startswith(SHELL_VARIABLES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    client = Client()
    assert (client.coordinator, client.sync_invoker) == (coordinator, sync_invoker)

    # dev.toml names the proxy, so the CLI and the SDK send every RPC through it:
    # with its socket moved away they fail naming it, and go direct when told to.
    assert client.proxy_socket == proxy_socket
    assert f"export PROXY_SOCKET_PATH={proxy_socket}" in banner
    aside = Path(proxy_socket).with_name("aside.sock")
    Path(proxy_socket).rename(aside)
    try:
        through = _blockx(shell, "invoke", "greet", '"proxy"', "--json")
        assert through.returncode == 3, through.stdout + through.stderr
        assert f"cannot reach the proxy at unix:{proxy_socket}" in through.stderr
        with SyncClient() as sdk, pytest.raises(ConnectError) as lost:
            sdk.function("greet").call("sdk")
        assert f"cannot reach the proxy at unix:{proxy_socket}" in lost.value.message
        with SyncClient(direct=True) as sdk:
            assert sdk.function("greet").call("direct sdk") == "hi direct sdk"
        direct = CliRunner().invoke(app, ["--direct", "invoke", "greet", '"direct"', "--json"])
        assert direct.exit_code == 0, direct.output
        assert "hi direct" in direct.output
    finally:
        aside.rename(proxy_socket)

    # Ctrl-C at the terminal: no traceback, the children stopped, the file removed.
    code, rest = dev.ctrl_c()
    assert code == 0, rest
    assert "blockx-dev: stopped" in rest
    assert "Traceback" not in rest
    assert "exited with code" not in rest
    assert not config_file.exists()
    for addr in (etcd, coordinator, sync_invoker):
        assert _refused(addr), addr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_functions_flag_wins_over_functions_dir(
    functions_dir: Path, home: Path, tmp_path: Path
) -> None:
    """--functions DIR is served even with FUNCTIONS_DIR naming another directory; a
    directory that does not exist is one line and a usage exit, before anything runs."""
    missing = tmp_path / "nowhere"
    env = _shell_env(home, FUNCTIONS_DIR=str(missing))
    dev = DevUp(env, "--functions", str(functions_dir), "--no-smoke", cwd=tmp_path)
    try:
        banner = dev.wait_for(READY_LINE)
        assert f"functions from {functions_dir}" in banner
        code, rest = dev.ctrl_c()
        assert code == 0, rest
    finally:
        dev.kill()
    failed = _blockx(env, "dev", "up", "--no-chain")
    assert failed.returncode == 2
    assert f"FUNCTIONS_DIR={missing} is not a directory" in failed.stderr
    assert "Traceback" not in failed.stdout + failed.stderr


def test_a_fixed_port_in_use_is_one_line(functions_dir: Path, home: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _shell_env(home, FUNCTIONS_DIR=str(functions_dir))
        result = subprocess.run(
            [BLOCKX, "dev", "up", "--no-chain", "--coordinator-port", str(port)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    line = f"blockx-dev: port {port} (--coordinator-port) is already in use"
    assert result.stderr.strip() == line
    assert "Traceback" not in result.stdout
    assert not (home / ".config" / "blockx" / "dev.toml").exists()


def _recording(binary: Path, started: Path, folder: Path) -> Path:
    """A stand-in for ``binary`` that notes in ``started`` that it ran, then runs it."""
    script = folder / binary.name
    script.write_text(f'#!/bin/sh\necho "$0" >> {started}\nexec {binary} "$@"\n')
    script.chmod(0o755)
    return script


def test_a_bad_variable_is_refused_before_etcd_and_anvil_start(
    functions_dir: Path, home: Path, tmp_path: Path
) -> None:
    """A shell's bad BLOCKX_LOG_FORMAT (every server reads it) and a bad Worker
    variable: one line each naming it, checked by the servers' own loaders before
    etcd or anvil runs; nothing left behind."""
    started, stand_ins, scratch = tmp_path / "started", tmp_path / "bin", tmp_path / "tmp"
    stand_ins.mkdir()
    scratch.mkdir()
    env = _shell_env(
        home,
        FUNCTIONS_DIR=str(functions_dir),
        ETCD_BIN=str(_recording(find_etcd_binary(), started, stand_ins)),
        ANVIL_BIN=str(_recording(find_anvil(), started, stand_ins)),
        TMPDIR=str(scratch),
        BLOCKX_LOG_FORMAT="yaml",
        TASK_SLOTS="many",
    )
    refused = _blockx(env, "dev", "up")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.splitlines() == [
        "blockx-dev: invalid configuration: BLOCKX_LOG_FORMAT must be text or json "
        "(got 'yaml') (read by every server)",
        "blockx-dev: invalid configuration: TASK_SLOTS must be an integer (got 'many') "
        "(read by blockx-worker, blockx-bundle-worker)",
        "blockx-dev: nothing was started",
    ]
    assert not started.exists(), started.read_text()
    assert "Traceback" not in refused.stdout
    assert list(scratch.iterdir()) == []
    assert not (home / ".config" / "blockx" / "dev.toml").exists()


def test_a_missing_etcd_or_anvil_is_one_line_each(
    functions_dir: Path, home: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    env = _shell_env(
        home, FUNCTIONS_DIR=str(functions_dir), ETCD_BIN=str(missing), ANVIL_BIN=str(missing)
    )
    refused = _blockx(env, "dev", "up")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stderr.splitlines()
    assert lines[0].startswith(f"blockx-dev: cannot start etcd: ETCD_BIN='{missing}' is not an ")
    assert lines[1:] == [
        f"blockx-dev: cannot start anvil: ANVIL_BIN={missing} is not an executable file",
        "blockx-dev: nothing was started",
    ]
    assert "Traceback" not in refused.stdout


def test_ctrl_c_while_starting_stops_cleanly(
    functions_dir: Path, home: Path, tmp_path: Path
) -> None:
    """Ctrl-C before the cluster is up: everything started so far stops, no traceback."""
    env = _shell_env(home, FUNCTIONS_DIR=str(functions_dir), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    dev = DevUp(env, cwd=tmp_path)
    try:
        dev.wait_for("[coordinator]")
        code, rest = dev.ctrl_c()
    finally:
        dev.kill()
    assert code == 0, rest
    assert "Traceback" not in rest
    assert "blockx-dev: stopped" in rest
    assert not (tmp_path / "xdg" / "blockx" / "dev.toml").exists()


def test_one_port_for_two_processes_is_one_line(
    functions_dir: Path, home: Path, tmp_path: Path
) -> None:
    port = str(_free_port())
    env = _shell_env(home, FUNCTIONS_DIR=str(functions_dir))
    result = subprocess.run(
        [BLOCKX, "dev", "up", "--no-chain", "--coordinator-port", port, "--worker-port", port],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"blockx-dev: port {port} (--worker-port) is given to two processes"
    )


def test_a_closed_terminal_stops_the_cluster(running: tuple[DevUp, str], home: Path) -> None:
    """SIGHUP, which a closing terminal sends, stops it as Ctrl-C does."""
    dev, _ = running
    config_file = home / ".config" / "blockx" / "dev.toml"
    etcd = tomllib.loads(config_file.read_text())["ETCD_ENDPOINTS"]
    os.kill(dev.proc.pid, signal.SIGHUP)
    rest, _ = dev.proc.communicate(timeout=60)
    assert dev.proc.returncode == 0, rest
    assert "blockx-dev: stopped" in rest
    assert not config_file.exists()
    assert _refused(etcd)


def test_dev_up_killed_outright_leaves_no_process_behind(running: tuple[DevUp, str]) -> None:
    dev, _ = running
    children = children_of(dev.proc.pid)
    assert len(children) >= 5, children  # etcd, coordinator, worker, invoker, proxy
    dev.kill()  # SIGKILL: dev up cleans nothing up itself
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(proc_stat(p) for p in children):
        time.sleep(0.1)
    assert [p for p in children if proc_stat(p) is not None] == []
