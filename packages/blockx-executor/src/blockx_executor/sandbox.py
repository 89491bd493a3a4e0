"""Guard rails for user code: no network, no processes, no file writes, no secrets.

All data reaches a function through the Worker (``io``), and all writes go through
a Writer Plugin, so an executor never needs to connect anywhere, start a process
or write a file. A PEP 578 audit hook, installed after the executor has connected
to its Worker, turns those attempts into a ``PermissionError`` with a message that
says why. It also refuses importing modules that start processes or make files
without an audit event (``_posixsubprocess``, ``_posixshmem``), any SQLite
connection (see ``_hook``), changing a function's code or defaults, and walking
the garbage collector's object lists (the way to reach the executor's objects).
Every change of any function's code or defaults it lets through is counted in
``CODE_WRITES``: the executor's integrity check compares its functions' code only
when that count moved (reading ``__code__`` raises an audit event, and 429 of them
per frame cost more than the calls of the frame).

Reads are decided on the path the kernel would open (``ReadRules``): symbolic
links resolved (``/dev/fd/N`` and ``/proc/self/fd/N`` included), and a relative
path against the working directory and against every directory the process holds
open, since the ``open`` audit event of ``os.open(path, dir_fd=fd)`` does not say
which directory ``path`` is relative to. A read is refused when it reaches another
process's ``/proc`` files, or a file (or a directory to list) that a user other
than its owner could not read, so that a Worker's ``--config`` file, its TLS keys
and root's home are as closed to an executor of the Worker's own user as the OS
closes them to ``nobody``. The import path (the interpreter's, taken at start-up)
is exempt: it is code, and the executor needs it.

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

import itertools
import os
import re
import stat
import sys
import threading
import types
from collections.abc import Callable, Iterable
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
# (a loaded _posixsubprocess is disarmed instead; loading it again is refused), and
# _posixshmem, whose shm_open makes files in /dev/shm without one.
_FORBIDDEN_IMPORTS: Final = frozenset(
    {"_posixsubprocess", "_posixshmem", "_testcapi", "_testinternalcapi"}
)
# Function attributes that, set on the executor's functions, change what it does.
_CODE_ATTRIBUTES: Final = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_ATTRIBUTE_CHANGES: Final = frozenset({"object.__setattr__", "object.__delattr__"})
# One step per event that sets or deletes a code attribute (of any object: one
# whose ``__module__`` was changed first is not recognised as the executor's).
# A count cannot be set back, only advanced; replacing it is a change of this
# module's globals, which the integrity check sees.
CODE_WRITES: Final = itertools.count()
# Calls without an audit event: (module, name, what the refusal says).
_UNAUDITED: Final = (
    ("os", "mkfifo", "write files"),
    ("os", "mknod", "write files"),
    ("_posixshmem", "shm_open", "write files"),
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


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _fd_directory(fd: int) -> str | None:
    """The path of what ``fd`` refers to; None when it has none (a deleted directory,
    a socket) or cannot be read."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if not target.startswith("/") or target.endswith(" (deleted)"):
        return None
    return target


def _working_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None  # removed


def _open_directories() -> list[str | None]:
    """Every directory this process holds a descriptor of (None: one whose path
    cannot be told)."""
    directories: list[str | None] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return [None]  # no /proc: no telling
    for name in names:
        try:
            is_directory = stat.S_ISDIR(os.fstat(int(name)).st_mode)
        except OSError:
            continue  # the listing's own descriptor, closed since
        if is_directory:
            directories.append(_fd_directory(int(name)))
    return directories


class ReadRules:
    """What a function may read, decided on resolved paths.

    ``code_roots`` are the directories Python imports from (exempt: they are code);
    ``own_pid`` is the executor's, whose ``/proc`` files are its own.
    """

    def __init__(self, *, own_pid: int, code_roots: Iterable[str]) -> None:
        self.own_pid = own_pid
        self.code_roots = tuple(os.path.realpath(r) for r in code_roots)

    def refusal(self, event: str, path: Any) -> str | None:
        """Why reading ``path`` (the first argument of an ``open``, ``os.listdir``
        or ``os.scandir`` event) is refused, or None."""
        if path is None:
            path = "."  # os.listdir() and os.scandir() list the working directory
        if isinstance(path, int):
            if event == "open":
                return None  # reading a descriptor already open (and checked then)
            directory = _fd_directory(path)
            if directory is None:
                return "read a directory whose path cannot be told"
            return self.refusal_of(directory)
        try:
            text = os.fsdecode(path)
        except TypeError:
            return None  # not a path: the call fails by itself
        if os.path.isabs(text):
            return self.refusal_of(os.path.realpath(text))
        # Relative: to the working directory, or (``os.open(path, dir_fd=fd)``, whose
        # event does not carry ``fd``) to any directory held open.
        bases: list[str | None] = [_working_directory()]
        if event == "open":
            bases += _open_directories()
        for base in bases:
            if base is None:
                return "read a path relative to a directory whose path cannot be told"
            why = self.refusal_of(os.path.realpath(os.path.join(base, text)))
            if why is not None:
                return why
        return None

    def refusal_of(self, resolved: str) -> str | None:
        """Why reading the resolved absolute path is refused, or None."""
        match = _PROC_PID.match(resolved)
        if match is not None and int(match.group(1)) != self.own_pid:
            return "read other processes' files"
        if _under(resolved, self.code_roots) or _readable_by_others(resolved):
            return None
        return "read files other users cannot read (the Worker's configuration, keys)"


def _readable_by_others(path: str) -> bool:
    """Could a user who is neither ``path``'s owner nor in its group read it (and
    reach it)? A path that does not exist is left to the call to fail."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True
    if not mode & stat.S_IROTH:
        return False
    directory = os.path.dirname(path)
    while True:
        try:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if directory == "/":
            return True
        directory = os.path.dirname(directory)


class _Hook:
    """The audit hook; ``deciding`` marks a thread whose read is being decided (the
    decision's own listing of ``/proc/self/fd`` is not a function's)."""

    def __init__(self, rules: ReadRules) -> None:
        self.rules = rules
        self.deciding = threading.local()

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "object.__getattr__":
            return  # the most frequent event, never refused
        if event in _FILE_CHANGES or (event == "open" and _is_write_open(args)):
            raise _deny("write files")
        if event in _PATH_READS and args and not getattr(self.deciding, "on", False):
            self.deciding.on = True
            try:
                why = self.rules.refusal(event, args[0])
            finally:
                self.deciding.on = False
            if why is not None:
                raise _deny(why)
        if event == "import" and args and args[0] in _FORBIDDEN_IMPORTS:
            raise _deny(f"import {args[0]}")
        if event in _ATTRIBUTE_CHANGES and len(args) > 1 and args[1] in _CODE_ATTRIBUTES:
            next(CODE_WRITES)
            if _is_executor_code(args[0]):
                raise _deny("change the executor's own code")
        if event in _GC_WALKS:
            raise _deny("walk the executor's objects")
        if event == "sqlite3.connect":
            # Even ":memory:": a connection ATTACHes database files and writes them
            # (ATTACH, VACUUM INTO) in C, with no audit event, and whatever is set on
            # it to stop that (an authorizer, a limit) its holder can unset.
            raise _deny("use SQLite (a connection can ATTACH and write database files)")
        if event in _NETWORK:
            raise _deny("open network connections")
        if event in _PROCESS:
            raise _deny("start or signal processes")


# This process's hook: its pid, and its import path as it is at start-up (the
# executor imports this module before any user code runs).
_hook: Final = _Hook(ReadRules(own_pid=os.getpid(), code_roots=[p for p in sys.path if p]))


def _is_executor_code(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".", 1)[0] == "blockx_executor"


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
