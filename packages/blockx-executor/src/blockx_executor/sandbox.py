"""Guard rails for user code: no network, no processes, no file writes.

All data reaches a function through the Worker (``io``), and all writes go through
a Writer Plugin, so an executor never needs to connect anywhere, start a process
or write a file. A PEP 578 audit hook, installed after the executor has connected
to its Worker, turns those attempts into a ``PermissionError`` with a message that
says why. It also refuses reading other processes' ``/proc`` files, opening an
SQLite database file, importing modules that start processes without an audit
event (``_posixsubprocess``), changing a function's code or defaults, and walking
the garbage collector's object lists (the way to reach the executor's objects).

Some calls raise no audit event at all (``os.mkfifo``, ``os.mknod``,
``os.pidfd_open``, ``signal.pidfd_send_signal``, ``signal.pthread_kill``,
``os.setpriority`` and ``os.sched_set*``): they are replaced in their modules by
functions that refuse.

Audit hooks cannot be removed from Python code; native code (ctypes, C
extensions) can still get around them, so this is a guard rail, not a security
boundary: the OS confinement (``blockx_executor.confine``: another user, its own
namespaces, resource limits) is the boundary.
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any, Final, NoReturn

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


_PATH_READS: Final = frozenset({"open", "os.listdir", "os.scandir"})
_GC_WALKS: Final = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
# Extension modules that start processes and raise no audit event of their own
# (a loaded _posixsubprocess is disarmed instead; loading it again is refused).
_FORBIDDEN_IMPORTS: Final = frozenset({"_posixsubprocess", "_testcapi", "_testinternalcapi"})
# Function attributes that, set on the executor's functions, change what it does.
_CODE_ATTRIBUTES: Final = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
# Calls without an audit event: (module, name, what the refusal says).
_UNAUDITED: Final = (
    ("os", "mkfifo", "write files"),
    ("os", "mknod", "write files"),
    ("posix", "mkfifo", "write files"),
    ("posix", "mknod", "write files"),
    ("os", "pidfd_open", "start or signal processes"),
    ("posix", "pidfd_open", "start or signal processes"),
    ("signal", "pidfd_send_signal", "start or signal processes"),
    ("_signal", "pidfd_send_signal", "start or signal processes"),
    ("signal", "pthread_kill", "start or signal processes"),
    ("_signal", "pthread_kill", "start or signal processes"),
    *(
        (module, name, "change other processes' scheduling")
        for module in ("os", "posix")
        for name in ("setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam")
    ),
)
_PROC_PID: Final = re.compile(r"^/proc/(\d+)(?:/|$)")
# An in-memory SQLite database is fine; a file is a write.
_SQLITE_MEMORY: Final = re.compile(r"^(:memory:$|file::memory:)")


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


def _other_process_path(path: Any) -> bool:
    """Is ``path`` under /proc/<pid> of a process other than this one?"""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or "proc" not in os.path.abspath(path):
        return False
    match = _PROC_PID.match(os.path.realpath(path))
    return match is not None and int(match.group(1)) != os.getpid()


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "object.__getattr__":
        return  # the most frequent event, never refused
    if event in _PATH_READS and args and _other_process_path(args[0]):
        raise _deny("read other processes' files")
    if event == "import" and args and args[0] in _FORBIDDEN_IMPORTS:
        raise _deny(f"import {args[0]}")
    if (
        event == "object.__setattr__"
        and len(args) > 1
        and args[1] in _CODE_ATTRIBUTES
        and _is_executor_code(args[0])
    ):
        raise _deny("change the executor's own code")
    if event in _GC_WALKS:
        raise _deny("walk the executor's objects")
    if event == "sqlite3.connect" and args and not _is_memory_database(args[0]):
        raise _deny("write files (an SQLite database file)")
    if event in _NETWORK:
        raise _deny("open network connections")
    if event in _PROCESS:
        raise _deny("start or signal processes")
    if event in _FILE_CHANGES or (event == "open" and _is_write_open(args)):
        raise _deny("write files")


def _is_executor_code(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".", 1)[0] == "blockx_executor"


def _is_memory_database(database: Any) -> bool:
    return isinstance(database, str) and _SQLITE_MEMORY.match(database) is not None


def _refusing(what: str) -> Callable[..., NoReturn]:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        raise _deny(what)

    return refused


def _remove_unaudited() -> None:
    # Imported later, a module would get the refusing versions from posix / _signal.
    for module_name, name, what in _UNAUDITED:
        module = sys.modules.get(module_name)
        if isinstance(module, types.ModuleType) and hasattr(module, name):
            setattr(module, name, _refusing(what))
    # fork_exec starts a process with no audit event. The loaded module keeps a
    # refusing one, and so does every module that imported it (subprocess keeps
    # ``_fork_exec``); loading the module afresh is refused by the hook.
    import _posixsubprocess

    fork_exec = _posixsubprocess.fork_exec
    refusing = _refusing("start or signal processes")
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is fork_exec:
                namespace[name] = refusing


def install_sandbox(hook: Callable[[str, tuple[Any, ...]], None] = _hook) -> None:
    _remove_unaudited()
    sys.addaudithook(hook)
