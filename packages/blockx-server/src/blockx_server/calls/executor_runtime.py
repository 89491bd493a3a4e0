"""The executor runtime: what executors import, where ``EXECUTOR_USER`` can read it.

An executor that switches to another user (``nobody``) must still import its code
after the switch, and a Worker's own installation is often out of that user's
reach: a virtual environment under a 0700 home, an interpreter under ``/root``
(pyenv), editable installs pointing into a checkout that may lie anywhere. So a
root Worker copies what executors import (the ``blockx_executor`` package and its
one dependency, ``msgspec``) into ``EXECUTOR_RUNTIME_DIR/<digest>``: owned by
root, read-only to everyone else, byte-compiled, named by the digest of its
files. Executors run it with ``python -I -S``: the standard library, msgspec and
blockx_executor, nothing of the Worker's environment or of site-packages.

The digest is of the files as the Worker finds them at start-up, so a Worker
started after an edit of the checkout gets a new runtime, and one runtime serves
every Worker of the same code (none copies it again). A Worker holds a shared lock
on ``<digest>.lock`` while it runs and touches it at start; at start-up it removes
the runtimes that no Worker holds and that no Worker started in the last day.

Nothing in the runtime or above it may be writable by another user: the files run
as every executor, so the directory and each of its parents must be owned by root
(or the Worker's user) and writable by no one else (a sticky parent such as
``/tmp`` excepted); otherwise ``RuntimeUnavailable`` says which one.
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import msgspec

import blockx_executor

DEFAULT_RUNTIME_DIR: Final = "/var/cache/blockx/executor"
# The packages executors import: blockx_executor and what it depends on.
_PACKAGES: Final = (Path(blockx_executor.__file__).parent, Path(msgspec.__file__).parent)
# Named so that the executors' command line still says blockx_executor (ps, pgrep -f).
LAUNCHER: Final = "run_blockx_executor.py"
# The packages are in lib/, beside the launcher (which puts them on sys.path: -I
# leaves the script's directory off it, and the launcher is not to be imported).
_LAUNCHER_TEXT: Final = '''"""A BlockX executor: python -I -S run_blockx_executor.py ARGS."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))

from blockx_executor.process import main

main()
'''
# A runtime that no Worker holds and none started for this long is removed.
UNUSED_FOR_S: Final = 24 * 3600
_BUILD_PREFIX: Final = ".build-"


class RuntimeUnavailable(Exception):
    """The runtime cannot be made or trusted here; ``str()`` says why."""


class ExecutorRuntime:
    """A runtime in use: its directory, and the lock that keeps it from being
    removed until ``close``."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self.launcher = path / LAUNCHER
        self._lock_fd: int | None = lock_fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None


def _sources() -> dict[str, bytes]:
    """Every file of the runtime by its path in it, the launcher included."""
    files = {LAUNCHER: _LAUNCHER_TEXT.encode()}
    for package in _PACKAGES:
        for path in sorted(package.rglob("*")):
            if "__pycache__" not in path.parts and path.is_file():
                name = f"lib/{package.name}/{path.relative_to(package).as_posix()}"
                files[name] = path.read_bytes()
    return files


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256(sys.implementation.cache_tag.encode())  # the byte code's version
    for name in sorted(files):
        h.update(f"\0{name}\0{len(files[name])}\0".encode())
        h.update(files[name])
    return h.hexdigest()[:32]


def _safe(st: os.stat_result) -> bool:
    """Owned by root or this process's user, and writable by no one else."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _check_root(root: Path) -> None:
    for directory in [*reversed(root.parents), root]:
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        os.chmod(directory, 0o755)  # whatever the umask
    if not _safe(root.lstat()) or root.is_symlink():
        raise RuntimeUnavailable(f"{root} must be a directory of root's that only root can write")
    for parent in root.parents:
        st = parent.stat()
        sticky = st.st_mode & stat.S_ISVTX and st.st_uid in (0, os.geteuid())
        if not (_safe(st) or sticky):
            raise RuntimeUnavailable(f"{parent} is writable by other users")


def _intact(target: Path, files: dict[str, bytes]) -> bool:
    """``target`` holds exactly ``files``' contents, and only its owner can change it."""
    try:
        for directory, _, names in os.walk(target):
            if not _safe(os.lstat(directory)):
                return False
            for name in names:
                if not _safe(os.lstat(os.path.join(directory, name))):
                    return False
        return all((target / name).read_bytes() == data for name, data in files.items())
    except OSError:
        return False


def _build(root: Path, digest: str, files: dict[str, bytes]) -> Path:
    """The runtime, made under a temporary name (renamed into place by the caller)."""
    build = Path(tempfile.mkdtemp(prefix=f"{_BUILD_PREFIX}{digest}-", dir=root))
    for name, data in files.items():
        path = build / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    # Executors cannot write byte code there: compile it once, here.
    compileall.compile_dir(str(build), quiet=2, workers=1)
    for directory, _, names in os.walk(build):
        os.chmod(directory, 0o755)
        for name in names:
            os.chmod(os.path.join(directory, name), 0o644)
    return build


def _place(root: Path, digest: str, files: dict[str, bytes]) -> None:
    target = root / digest
    if _intact(target, files):
        return
    build = _build(root, digest, files)
    if target.exists():
        # Broken (a build cut short, a file edited): set aside, then removed.
        stale = Path(tempfile.mkdtemp(prefix=f"{_BUILD_PREFIX}stale-", dir=root))
        with contextlib.suppress(FileNotFoundError):
            target.rename(stale / digest)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        build.rename(target)
    except OSError:
        # Another Worker placed it first.
        shutil.rmtree(build, ignore_errors=True)
        if not _intact(target, files):
            raise RuntimeUnavailable(f"{target} does not hold the executor's files") from None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _hold(root: Path, digest: str) -> int:
    """A shared lock on ``<digest>.lock``, which a Worker that removes runtimes takes
    exclusively: held, the runtime stays."""
    path = root / f"{digest}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if _same_file(fd, path):
            os.utime(fd)  # started now: not unused
            return fd
        os.close(fd)  # removed while we waited for it: take the new one


def _prune(root: Path, keep: str, now: float) -> None:
    """Remove the runtimes no Worker holds and none started within UNUSED_FOR_S, and
    builds a Worker left behind."""
    for entry in root.iterdir():
        if entry.name.startswith(_BUILD_PREFIX):
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > UNUSED_FOR_S:
                    shutil.rmtree(entry, ignore_errors=True)
            continue
        if entry.suffix != ".lock" or entry.stem == keep:
            continue
        try:
            fd = os.open(entry, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, entry) and now - os.fstat(fd).st_mtime > UNUSED_FOR_S:
                shutil.rmtree(root / entry.stem, ignore_errors=True)
                entry.unlink()
        except OSError:
            pass  # held: in use
        finally:
            os.close(fd)


def install(root: Path) -> ExecutorRuntime:
    """The runtime of the executor code this process imported, under ``root``, held
    until ``close``. Blocking (file copies): run it off the event loop."""
    files = _sources()
    digest = _digest(files)
    try:
        _check_root(root)
        fd = _hold(root, digest)
    except OSError as exc:
        raise RuntimeUnavailable(f"{root}: {exc.strerror or exc}") from None
    try:
        _place(root, digest, files)
        _prune(root, keep=digest, now=time.time())
    except BaseException:
        os.close(fd)
        raise
    return ExecutorRuntime(root / digest, fd)


def interpreters() -> list[str]:
    """Interpreters that can run the runtime: this one's Python version (the byte
    code and msgspec's extension are built for it), this very interpreter first."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
    found = [os.path.realpath(c) for c in candidates if c and os.path.isfile(c)]
    return list(dict.fromkeys(found))


def unreachable(path: Path, uid: int, gid: int) -> Path | None:
    """The first directory on the way to ``path`` (or ``path`` itself) that the user
    ``uid:gid`` (without supplementary groups) cannot enter or read; None if none."""
    for directory in [*reversed(path.parents), path]:
        try:
            st = directory.stat()
        except OSError:
            return directory
        if st.st_uid == uid:
            bits = st.st_mode >> 6
        elif st.st_gid == gid:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        if directory != path:
            need = 0o1  # entered
        elif stat.S_ISDIR(st.st_mode):
            need = 0o5  # entered and listed (Python lists the directories it imports from)
        else:
            need = 0o4  # read
        if bits & need != need:
            return directory
    return None
