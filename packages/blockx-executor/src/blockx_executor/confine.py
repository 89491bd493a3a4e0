"""The executor's OS confinement, applied at start-up before any user code runs.

The Worker starts ``python -m blockx_executor`` as itself (root, typically) and the
executor confines itself, in this order, because each step needs the privileges the
next one gives up:

1. its own network and mount namespaces (``unshare``), mounts made private, and,
   when it will run as another user, a fresh ``/proc`` that shows only that user's
   processes (``hidepid=invisible``);
2. the user it runs as (``setgroups([])``, ``setgid``, ``setuid``): a process that
   changed user is not dumpable, so other processes of that user (other executors)
   can neither trace it nor read its ``/proc`` files, and the Worker's own
   ``/proc/<pid>`` files (root's, mode 0400) are closed to it;
3. ``PR_SET_PDEATHSIG`` (set after the user change, which clears it): the kernel
   kills the executor when the Worker dies;
4. resource limits (address space, file size, processes, open files, no core files).

``probe`` runs steps 1 and 2 and reports what failed, so the Worker can fall back
once, with one warning, instead of every executor failing at start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import sys
from typing import Final

_CLONE_NEWNS: Final = 0x00020000
_CLONE_NEWUSER: Final = 0x10000000
_CLONE_NEWNET: Final = 0x40000000
_MS_REC: Final = 0x4000
_MS_PRIVATE: Final = 0x40000
_MS_NOSUID: Final = 0x2
_MS_NODEV: Final = 0x4
_MS_NOEXEC: Final = 0x8
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_DUMPABLE: Final = 4

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class ConfinementError(Exception):
    """A confinement step failed; ``str()`` says which and why."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise ConfinementError(f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces(run_as_other_user: bool) -> None:
    """New network and mount namespaces; as a non-root user, inside a user namespace
    that maps only that user. The Worker's socket is already connected: a new network
    namespace closes the network and abstract Unix sockets, not connected ones."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNET | _CLONE_NEWNS
    if uid != 0:
        flags |= _CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare(CLONE_NEWNET|CLONE_NEWNS)")
    if uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    # Mounts made here must not reach the host's namespace.
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making mounts private")
    if run_as_other_user:
        _check(
            _libc.mount(
                b"proc",
                b"/proc",
                b"proc",
                _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                b"hidepid=invisible",
            ),
            "mounting /proc with hidepid=invisible",
        )


def become(uid: int, gid: int) -> None:
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        raise ConfinementError(f"switching to uid {uid}: {exc.strerror}") from None


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL when the Worker dies; if it died already, stop now."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # Not dumpable: processes of the same user cannot trace it or read its /proc files.
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    if os.getppid() != parent_pid:
        raise ConfinementError(f"the Worker (pid {parent_pid}) is gone")


def import_paths() -> list[str]:
    """The directories Python imports from; taken before the user change, when they
    can still be seen."""
    candidates = [os.path.dirname(os.path.realpath(sys.executable)), *sys.path]
    return [p for p in dict.fromkeys(candidates) if p and os.path.isdir(p)]


def unreadable(paths: list[str]) -> list[str]:
    """Those of ``paths`` the current user cannot read (or reach)."""
    return [p for p in paths if not os.access(p, os.R_OK | os.X_OK)]


def apply_limits(*, memory_bytes: int, open_files: int, file_bytes: int, processes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if file_bytes > 0:
        # Python ignores SIGXFSZ: a write past the limit fails with EFBIG.
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if processes > 0 and os.getuid() != 0:
        # Counted per user (root is exempt): other executors' threads count too.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    if open_files > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = open_files if hard == resource.RLIM_INFINITY else min(open_files, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
