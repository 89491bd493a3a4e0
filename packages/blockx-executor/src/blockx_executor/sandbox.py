"""Guard rails for user code: no network, no processes, no file writes.

All data reaches a function through the Worker (``io``), and all writes go through
a Writer Plugin, so an executor never needs to connect anywhere, start a process
or write a file. A PEP 578 audit hook, installed after the executor has connected
to its Worker, turns those attempts into a ``PermissionError`` with a message that
says why. Audit hooks cannot be removed from Python code; native code (ctypes, C
extensions) can still get around them, so this is a guard rail, not a security
boundary: run executors under an OS sandbox where that matters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Final

_WRITE_FLAGS: Final = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

_NETWORK: Final = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"})
_PROCESS: Final = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "pty.spawn",
    }
)
_FILE_CHANGES: Final = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.move",
    }
)


def _deny(what: str) -> PermissionError:
    return PermissionError(
        f"BlockX functions cannot {what}: read data with `await io.<backend>.<op>(...)` "
        "and return results; writes belong to a Writer Plugin"
    )


def _is_write_open(args: tuple[Any, ...]) -> bool:
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in _NETWORK:
        raise _deny("open network connections")
    if event in _PROCESS:
        raise _deny("start or signal processes")
    if event in _FILE_CHANGES or (event == "open" and _is_write_open(args)):
        raise _deny("write files")


def install_sandbox(hook: Callable[[str, tuple[Any, ...]], None] = _hook) -> None:
    sys.addaudithook(hook)
