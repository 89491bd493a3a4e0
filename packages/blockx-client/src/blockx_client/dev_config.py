"""The running local cluster's addresses: ``~/.config/blockx/dev.toml``.

``blockx dev up`` picks free ports, so nothing can guess where its etcd or its
Coordinator listen. While it runs it writes them to this file, keyed by the
environment variable each one would be set in (``ETCD_ENDPOINTS``,
``BLOCKX_COORDINATOR``, ...), and removes the file when it stops. The CLI and the
SDK read it when it is there, below the flags and the environment:

    flag or argument > environment variable > dev.toml > built-in default

The file names the process that wrote it (``[writer] pid``); a file whose writer
is gone (a ``dev up`` killed with SIGKILL) is ignored, so a stale file never
sends calls to ports nobody listens on.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from blockx_client.errors import InvalidRequestError
from blockx_core.environ import EnvironOverFile

# The variables ``dev up`` writes, in the order the file lists them.
DEV_VARIABLES: Final = (
    "ETCD_ENDPOINTS",
    "BLOCKX_COORDINATOR",
    "BLOCKX_BUNDLE_COORDINATOR",
    "BLOCKX_SYNC_INVOKER",
)


def dev_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/blockx/dev.toml``, by default ``~/.config/blockx/dev.toml``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "").strip()
    if not base:
        home = env.get("HOME", "").strip() or str(Path.home())
        base = str(Path(home) / ".config")
    return Path(base) / "blockx" / "dev.toml"


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
        super().__init__(environ, read_dev_config(dev_config_path(environ)) if dev is None else dev)
