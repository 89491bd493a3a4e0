"""What an executor process costs, read from the kernel rather than asked of it.

User code runs inside the executor and can replace any clock or figure the
executor reports about itself, so the Worker reads the kernel's accounting:

* CPU: ``/proc/<pid>/task/<pid>/schedstat``, whose first field is the nanoseconds
  the thread has spent on a CPU and whose second the nanoseconds it was runnable
  but waited for one (what tells a call that blocks from one that only waits its
  turn, ``blockx_core.dispatch._lanes``). The executor runs calls on its main thread
  (whose thread id is the process id); its heartbeat thread is not counted. When that file
  cannot be read, the process-wide CPU clock of the child (``clock_gettime`` on the
  clock id Linux derives from a pid) is the fallback, which also counts the
  heartbeat thread and does not say how long it waited; failing both, there is no
  sample (None) and the dispatcher falls back to what the executor's heartbeat
  reports. Threads that user code starts are not counted either way.
* Resident memory: ``/proc/<pid>/statm``, second field, in pages.

Both files are opened once and read again with ``pread`` at offset 0, which makes
the kernel render them afresh: about 2 µs a sample instead of 12 µs for an open,
read and close (the Worker samples at every frame from an executor). A descriptor
stays bound to the process it was opened for, so a pid the kernel hands to another
process later is never read in its place: once the executor is gone, reading fails
(ESRCH) and there is no sample. ``close()`` gives the descriptors back.

Each fallback is logged once per process.
"""

from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple

log = logging.getLogger(__name__)

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# schedstat and statm are one line of a few numbers.
_PROC_READ_BYTES = 256
_warned: set[str] = set()


def _warn_once(what: str, message: str, *args: object) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(message, *args)


def _process_cpu_clock(pid: int) -> int:
    # Linux's CPUCLOCK_SCHED of a whole process: ((~pid) << 3) | 2.
    return ((~pid) << 3) | 2


class CpuTimes(NamedTuple):
    """An executor call thread's time on a CPU, and waiting for one (None: not known)."""

    used_ns: int
    waited_ns: int | None


class ExecutorGauge:
    """Reads one executor's call-thread CPU time and resident memory."""

    __slots__ = ("_pid", "_schedstat", "_statm")

    def __init__(self, pid: int) -> None:
        self._pid = pid
        # Opened on first use; None once it cannot be read (schedstat: use the clock).
        self._schedstat: _ProcFile | None = _ProcFile(f"/proc/{pid}/task/{pid}/schedstat")
        self._statm = _ProcFile(f"/proc/{pid}/statm")

    def close(self) -> None:
        if self._schedstat is not None:
            self._schedstat.close()
        self._statm.close()

    def cpu(self) -> CpuTimes | None:
        """Nanoseconds on a CPU, and waiting for one, so far (None: no way to read it)."""
        schedstat = self._schedstat
        if schedstat is not None:
            try:
                used, waited = schedstat.read().split(maxsplit=2)[:2]
                return CpuTimes(int(used), int(waited))
            except (OSError, ValueError, IndexError) as exc:
                if not os.path.exists(f"/proc/{self._pid}"):
                    return None  # the process is gone; nothing to fall back to
                schedstat.close()
                self._schedstat = None
                _warn_once(
                    "schedstat",
                    "cannot read %s (%s): executor CPU is measured with the process CPU "
                    "clock instead",
                    schedstat.path,
                    exc,
                )
        try:
            return CpuTimes(time.clock_gettime_ns(_process_cpu_clock(self._pid)), None)
        except OSError as exc:
            _warn_once(
                "cpu-clock",
                "cannot read an executor's CPU clock (%s): the CPU budget relies on what "
                "the executor reports",
                exc,
            )
            return None

    def rss_bytes(self) -> int | None:
        statm = self._statm
        try:
            return int(statm.read().split()[1]) * _PAGE_BYTES
        except (OSError, ValueError, IndexError) as exc:
            statm.close()  # opened afresh at the next sample
            if os.path.exists(f"/proc/{self._pid}"):
                _warn_once(
                    "statm",
                    "cannot read %s (%s): executors are not retired for their memory",
                    statm.path,
                    exc,
                )
            return None


class _ProcFile:
    """A small /proc file kept open and read whole from its start each time."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1

    def read(self) -> bytes:
        """Its current text; raises OSError (the process is gone, or no such file)."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self._fd, _PROC_READ_BYTES, 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
