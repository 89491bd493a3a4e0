"""The running local cluster's addresses: ``~/.config/blockx/dev.toml``.

``blockx dev up`` picks free ports and temporary files, so nothing can guess
where its etcd, its Coordinator or its databases are. While it runs it writes
them to this file, keyed by the environment variable each one would be set in
(``ETCD_ENDPOINTS``, ``BLOCKX_COORDINATOR``, ``PROXY_SOCKET_PATH``,
``SINK_DB_URL``, ...), and removes the file when it stops. The CLI and the
SDK read it when it is there, below the flags and the environment:

    flag or argument > environment variable > dev.toml > built-in default

Where each address came from is kept with it (``LayeredEnviron.setting``): a
connection that fails says so, e.g. "BLOCKX_COORDINATOR from the environment;
dev.toml says 127.0.0.1:41234 — unset BLOCKX_COORDINATOR?" when an export left
by an earlier ``dev up`` hides the running one's address.

The file names the process that wrote it (``[writer] pid``); a file whose writer
is gone (a ``dev up`` killed with SIGKILL) is ignored, so a stale file never
sends calls to ports nobody listens on.

One ``dev up`` at a time owns the file: it holds an exclusive lock on
``dev.lock`` next to it (``claim_dev_config``) from before it starts anything
until it has stopped, and a second one is refused with the first one's pid. The
kernel drops the lock when its holder dies, however it dies, so a stale file is
simply replaced by the next ``dev up``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from blockx_client.errors import InvalidRequestError
from blockx_client.setting import Origin, Setting
from blockx_core.environ import EnvironOverFile

# The variables ``dev up`` writes, in the order the file lists them: where the
# cluster listens, its proxy (through which the SDK and the CLI then send every
# RPC), and its chain: the node, the block database the Workers read and the sink
# they write (``blockx backfill`` and ``follow`` default to these).
DEV_VARIABLES: Final = (
    "ETCD_ENDPOINTS",
    "BLOCKX_COORDINATOR",
    "BLOCKX_BUNDLE_COORDINATOR",
    "BLOCKX_SYNC_INVOKER",
    "PROXY_SOCKET_PATH",
    "CHAIN_RPC_URL",
    "BLOCKDB_URL",
    "SINK_DB_URL",
)


def dev_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/blockx/dev.toml``, by default ``~/.config/blockx/dev.toml``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "").strip()
    if not base:
        home = env.get("HOME", "").strip() or str(Path.home())
        base = str(Path(home) / ".config")
    return Path(base) / "blockx" / "dev.toml"


def dev_lock_path(config: Path | None = None) -> Path:
    """``dev.lock`` next to the file (``config``, default ``dev_config_path()``)."""
    return (dev_config_path() if config is None else config).with_name("dev.lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def read_dev_config(path: Path | None = None) -> dict[str, str]:
    """The variables of the running ``dev up``; empty when there is none.

    A file that is not TOML is InvalidRequestError naming it (delete it, or run
    ``dev up`` again, which rewrites it)."""
    path = dev_config_path() if path is None else path
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    try:
        document = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"{path} is not valid TOML ({exc}); delete it") from None
    writer = document.get("writer")
    pid = writer.get("pid") if isinstance(writer, dict) else None
    if isinstance(pid, int) and not _alive(pid):
        return {}
    return {
        name: value.strip()
        for name, value in document.items()
        if name in DEV_VARIABLES and isinstance(value, str) and value.strip()
    }


def _toml_string(value: str) -> str:
    # A JSON string with ASCII escapes is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def write_dev_config(values: Mapping[str, str], path: Path | None = None) -> Path:
    """Write ``values`` (variables of DEV_VARIABLES) with this process as the writer.

    The file is replaced atomically, so a reader sees the old file or the new one."""
    path = dev_config_path() if path is None else path
    lines = [
        "# Written by `blockx dev up` while it runs; removed when it stops.",
        "# Keys are the environment variables that would override them.",
    ]
    lines += [
        f"{name} = {_toml_string(values[name])}" for name in DEV_VARIABLES if values.get(name)
    ]
    lines += ["", "[writer]", f"pid = {os.getpid()}", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text("\n".join(lines))
    partial.replace(path)
    return path


class DevUpRunning(Exception):
    """Another ``dev up`` holds ``dev.lock``; ``str()`` is the one line users see."""

    def __init__(self, pid: int | None, lock: Path) -> None:
        self.pid = pid
        if pid is None:  # it has the lock and has not written its pid yet
            stop = "stop it first (Ctrl-C in its terminal)"
        else:
            stop = f"stop it first: Ctrl-C in its terminal, or kill -INT {pid}"
        running = "another blockx dev up is running" + ("" if pid is None else f" (pid {pid})")
        super().__init__(f"{running}, holding {lock}; {stop}")


@contextlib.contextmanager
def claim_dev_config(path: Path | None = None) -> Iterator[Path]:
    """Hold ``dev.lock`` next to ``path`` (default: ``dev_config_path()``) while the
    block runs, so that this process alone writes and removes ``path``; yields it.

    DevUpRunning, with the holder's pid, when another process holds the lock. The
    lock file stays (removing it would let a third process lock a new file while a
    second still holds the old one); it holds the pid of its last holder."""
    path = dev_config_path() if path is None else path
    lock = dev_lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DevUpRunning(_holder(fd), lock) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def remove_dev_config(path: Path | None = None) -> None:
    """Remove the file if this process wrote it (a later ``dev up`` may own it now)."""
    path = dev_config_path() if path is None else path
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return
    writer = document.get("writer")
    if isinstance(writer, dict) and writer.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class LayeredEnviron(EnvironOverFile):
    """The environment over ``dev.toml``: a set, non-blank variable wins over the file."""

    def __init__(
        self, environ: Mapping[str, str] | None = None, dev: Mapping[str, str] | None = None
    ) -> None:
        environ = os.environ if environ is None else environ
        dev = read_dev_config(dev_config_path(environ)) if dev is None else dev
        super().__init__(environ, dev)
        self._dev = dev

    def setting(
        self,
        variable: str,
        given: str | None = None,
        default: str | None = None,
        *,
        given_origin: Origin = Origin.GIVEN,
    ) -> Setting:
        """``variable``'s value and origin: ``given`` (a flag or an argument, unless
        ``given_origin`` says the caller read it from the environment), else the
        environment, else dev.toml, else ``default``. Blank counts as unset."""
        dev_value = self._dev.get(variable)
        if given is not None and given.strip():
            return Setting(
                variable=variable, value=given.strip(), origin=given_origin, dev_value=dev_value
            )
        found = self.get(variable, "").strip()
        if found:
            origin = Origin.DEV_CONFIG if self.from_file(variable) else Origin.ENVIRONMENT
            return Setting(variable=variable, value=found, origin=origin, dev_value=dev_value)
        return Setting(variable=variable, value=default, origin=Origin.DEFAULT)

    def overridden(self) -> list[str]:
        """The variables the environment sets to other values than dev.toml's: most
        likely exports left from an earlier ``blockx dev up``."""
        return [
            name
            for name, value in self._dev.items()
            if not self.from_file(name) and self.get(name, "").strip() != value
        ]
