"""Every block of README.md and docs/*.md that runs, run against one ``blockx dev up``.

One cluster serves the module, started as a newcomer starts it (``.venv/bin/blockx dev
up``, the repository's examples, its chain; one executor a process and no dashboard),
its dev.toml under a temporary ``XDG_CONFIG_HOME``. Each document's blocks run in
order in a scratch directory of its own holding a copy of ``examples/``, as if at
the repository root; the environment has no BlockX variable, so ``blockx`` and
``Client()`` find the cluster through dev.toml, as in any shell; ``uv`` and the
virtual environment are on PATH, so ``uv run blockx ...`` runs the workspace's
``blockx``. The conventions are in docs/development.md.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from docs.blocks import Block, DocBlockError, Mode, documents, parse_blocks, tally
from docs.runner import TALLY_KEY, failure, run_block

ROOT: Final = Path(__file__).resolve().parents[2]
VENV_BIN: Final = Path(sys.executable).parent
READY_LINE: Final = "Press Ctrl-C to stop."
# No block reads the dashboard or counts executors: fewer processes start sooner.
DEV_UP: Final = (str(VENV_BIN / "blockx"), "dev", "up")
DEV_UP_OPTIONS: Final = ("--executors", "1", "--no-dashboard")
READY_TIMEOUT_S: Final = 180.0
# A block is a few commands of a few seconds each; one that takes this long is hung.
BLOCK_TIMEOUT_S: Final = 120.0
# What a fresh shell has none of: any of these would beat dev.toml.
SHELL_VARIABLES: Final = (
    "BLOCKX_",
    "ETCD_",
    "PROXY_",
    "FUNCTIONS_DIR",
    "XDG_CONFIG",
    "BLOCKDB_URL",
    "SINK_DB_URL",
    "CHAIN_RPC_URL",
    "VIRTUAL_ENV",
)


def _uv_bin() -> Path:
    """The uv that runs this test (``uv run`` names itself in ``UV``), else PATH's."""
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "no uv: the docs say `uv run ...`; run the tests with `uv run pytest`"
    return Path(found)


def _shell_env(config_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SHELL_VARIABLES)}
    path = os.pathsep.join([str(VENV_BIN), str(_uv_bin().parent), env["PATH"]])
    return {
        **env,
        "PATH": path,
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "XDG_CONFIG_HOME": str(config_home),
    }


@dataclass(frozen=True)
class DevCluster:
    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]  # a shell's environment that finds it through dev.toml


def _start_dev_up(base: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``blockx dev up`` with its chain, running once its ready line is out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*DEV_UP, "--examples", str(ROOT / "examples"), *DEV_UP_OPTIONS],
            cwd=base,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while READY_LINE not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            return proc
        if time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"dev up not ready in {READY_TIMEOUT_S:g} s:\n{log.read_text()}")
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to its process group, as a terminal sends it; SIGKILL if that is not enough."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """``blockx dev up`` with its chain, until the module ends. dev up picks free ports
    and then binds them; on a machine running other tests one may be taken in between
    ("address already in use"), and then a second dev up picks others."""
    base = tmp_path_factory.mktemp("dev-up")
    env = _shell_env(base / "config")
    for attempt in (1, 2):
        log = base / f"dev-up-{attempt}.log"
        proc = _start_dev_up(base, env, log)
        said = log.read_text(errors="replace")
        if proc.poll() is None or "address already in use" not in said or attempt == 2:
            break
    assert proc.poll() is None, f"dev up exited {proc.returncode}:\n{said}"
    try:
        yield DevCluster(proc=proc, log=log, env=env)
    finally:
        _stop(proc)


def _repository_state() -> dict[str, str]:
    """What ``git status`` sees, with a hash of each changed or new file's content (a
    file changed before and changed again shows the same status line)."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    state = {}
    for line in listed:
        path = ROOT / line[3:].split(" -> ")[-1]
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"
        state[line] = digest
    return state


def _read(path: Path) -> tuple[list[Block], str | None]:
    try:
        return parse_blocks(path.read_text(), str(path.relative_to(ROOT))), None
    except DocBlockError as error:
        return [], str(error)


def _documents_that_run() -> list[Path]:
    """Those with a block that runs, and those that break the conventions (to fail)."""
    chosen = []
    for path in documents(ROOT):
        blocks, error = _read(path)
        if error is not None or any(b.mode is Mode.RUN for b in blocks):
            chosen.append(path)
    return chosen


@pytest.mark.parametrize("doc", _documents_that_run(), ids=lambda p: p.name)
def test_the_blocks_of_a_document_run_as_written(
    doc: Path,
    dev_cluster: DevCluster,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    blocks, error = _read(doc)
    assert error is None, error
    scratch = tmp_path_factory.mktemp(doc.stem)
    shutil.copytree(ROOT / "examples", scratch / "examples")
    before = _repository_state()
    started = time.monotonic()
    failures = []
    for block in blocks:
        if block.mode is Mode.RUN:
            run = run_block(block, cwd=scratch, env=dev_cluster.env, timeout_s=BLOCK_TIMEOUT_S)
            failed = failure(block, run, timeout_s=BLOCK_TIMEOUT_S)
            if failed is not None:
                failures.append(failed)
    counted = tally(str(doc.relative_to(ROOT)), blocks)
    seconds = time.monotonic() - started
    request.config.stash[TALLY_KEY].append(f"{counted.line()} in {seconds:.1f} s")
    assert _repository_state() == before, f"{counted.source}'s blocks changed the repository"
    assert dev_cluster.proc.poll() is None, (
        f"dev up stopped while {counted.source}'s blocks ran:\n{dev_cluster.log.read_text()}"
    )
    assert not failures, "\n\n".join(failures)


def test_watch_off_a_terminal_ends_its_last_line(dev_cluster: DevCluster, tmp_path: Path) -> None:
    """Off a terminal rich ends a live display's last render without a newline, so the
    user guide's next command printed on the same line as `watch`'s bar."""

    def blockx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "blockx"), *args],
            env=dev_cluster.env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )

    task = ("--task-id", "watch-piped")
    submitted = blockx("submit", "--function", "hello_world", "--call", '["ct2"]', *task, "--wait")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    watched = blockx("watch", "watch-piped")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "SUCCEEDED" in watched.stdout
    assert watched.stdout.endswith("\n"), watched.stdout[-300:]
