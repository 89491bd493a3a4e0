"""The executor runtime on a real file system: made once per version of the code,
reused, rebuilt when its files differ, never trusted when others can write it, and
removed once no Worker holds it and none used it for a day."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import blockx_executor
from blockx_server.calls.executor_runtime import (
    LAUNCHER,
    UNUSED_FOR_S,
    ExecutorRuntime,
    RuntimeUnavailable,
    install,
    unreachable,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path / "runtime"


@pytest.fixture
def runtime(root: Path) -> Iterator[ExecutorRuntime]:
    held = install(root)
    yield held
    held.close()


def test_a_runtime_holds_the_executor_code_read_only(runtime: ExecutorRuntime) -> None:
    module = runtime.path / "lib" / "blockx_executor" / "runner.py"
    assert module.read_bytes() == (Path(blockx_executor.__file__).parent / "runner.py").read_bytes()
    assert (runtime.path / "lib" / "msgspec" / "__init__.py").is_file()
    assert runtime.launcher == runtime.path / LAUNCHER
    assert list((runtime.path / "lib" / "blockx_executor" / "__pycache__").glob("runner.*.pyc"))
    for directory, _, names in os.walk(runtime.path):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
        for name in names:
            assert stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) == 0o644


def test_the_same_code_reuses_its_runtime(root: Path, runtime: ExecutorRuntime) -> None:
    made = runtime.path.stat().st_ino
    again = install(root)
    try:
        assert again.path == runtime.path
        assert again.path.stat().st_ino == made
    finally:
        again.close()


def test_a_runtime_whose_files_differ_is_rebuilt(root: Path, runtime: ExecutorRuntime) -> None:
    module = runtime.path / "lib" / "blockx_executor" / "runner.py"
    original = module.read_bytes()
    module.write_bytes(b"forged = True\n")
    again = install(root)
    try:
        assert module.read_bytes() == original
    finally:
        again.close()


def test_a_directory_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    with pytest.raises(RuntimeUnavailable, match="is writable by other users"):
        install(tmp_path / "runtime")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    tmp_path.chmod(0o755)
    with pytest.raises(RuntimeUnavailable, match="only root can write"):
        install(shared)


def _old_runtime(root: Path, name: str, *, age_s: float) -> Path:
    (root / name).mkdir()
    (root / name / LAUNCHER).write_text("")
    lock = root / f"{name}.lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return root / name


def test_unheld_runtimes_unused_for_a_day_are_removed(root: Path) -> None:
    install(root).close()
    old = _old_runtime(root, "0" * 32, age_s=UNUSED_FOR_S + 60)
    recent = _old_runtime(root, "1" * 32, age_s=60)
    held_old = _old_runtime(root, "2" * 32, age_s=UNUSED_FOR_S + 60)
    fd = os.open(root / f"{held_old.name}.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a Worker of that code still runs
    try:
        install(root).close()
    finally:
        os.close(fd)
    assert not old.exists()
    assert not (root / f"{old.name}.lock").exists()
    assert recent.exists()
    assert held_old.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="checks another user's view as root")
def test_unreachable_names_the_first_directory_a_user_cannot_enter() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="blockx-reach-"))
    tmp_path.chmod(0o755)
    try:
        _check_reach(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _check_reach(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "inside").mkdir(mode=0o755)
    public = tmp_path / "public"
    public.mkdir(mode=0o755)
    (public / "file").write_text("x")
    (public / "file").chmod(0o600)
    nobody = (65534, 65534)
    assert unreachable(closed / "inside", *nobody) == closed
    assert unreachable(public, *nobody) is None
    assert unreachable(public / "file", *nobody) == public / "file"
    assert unreachable(public / "file", 0, 0) is None  # its owner
