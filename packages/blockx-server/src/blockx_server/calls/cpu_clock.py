"""What an executor process costs, read from the kernel rather than asked of it.

User code runs inside the executor and can replace any clock or figure the
executor reports about itself, so the Worker reads the kernel's accounting:

* CPU: ``/proc/<pid>/task/<pid>/schedstat``, whose first field is the nanoseconds
  the thread has spent on a CPU. The executor runs calls on its main thread (whose
  thread id is the process id); its heartbeat thread is not counted. When that file
  cannot be read, the process-wide CPU clock of the child (``clock_gettime`` on the
  clock id Linux derives from a pid) is the fallback, which also counts the
  heartbeat thread; failing both, there is no sample (None) and the dispatcher falls
  back to what the executor's heartbeat reports. Threads that user code starts are
  not counted either way.
* Resident memory: ``/proc/<pid>/statm``, second field, in pages.

Each fallback is logged once per process.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_warned: set[str] = set()


def _warn_once(what: str, message: str, *args: object) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(message, *args)


def _process_cpu_clock(pid: int) -> int:
    # Linux's CPUCLOCK_SCHED of a whole process: ((~pid) << 3) | 2.
    return ((~pid) << 3) | 2


class ExecutorGauge:
    """Reads one executor's call-thread CPU time and resident memory."""

    __slots__ = ("_pid", "_schedstat", "_statm")

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._schedstat: str | None = f"/proc/{pid}/task/{pid}/schedstat"
        self._statm = f"/proc/{pid}/statm"

    def cpu_ns(self) -> int | None:
        """Nanoseconds on a CPU so far (None: no way to read it)."""
        if self._schedstat is not None:
            try:
                with open(self._schedstat, "rb") as f:
                    return int(f.read().split(maxsplit=1)[0])
            except (OSError, ValueError, IndexError) as exc:
                if not os.path.exists(f"/proc/{self._pid}"):
                    return None  # the process is gone; nothing to fall back to
                self._schedstat = None
                _warn_once(
                    "schedstat",
                    "cannot read %s (%s): executor CPU is measured with the process CPU "
                    "clock instead",
                    f"/proc/{self._pid}/task/{self._pid}/schedstat",
                    exc,
                )
        try:
            return time.clock_gettime_ns(_process_cpu_clock(self._pid))
        except OSError as exc:
            _warn_once(
                "cpu-clock",
                "cannot read an executor's CPU clock (%s): the CPU budget relies on what "
                "the executor reports",
                exc,
            )
            return None

    def rss_bytes(self) -> int | None:
        try:
            with open(self._statm, "rb") as f:
                return int(f.read().split()[1]) * _PAGE_BYTES
        except (OSError, ValueError, IndexError) as exc:
            if os.path.exists(f"/proc/{self._pid}"):
                _warn_once(
                    "statm",
                    "cannot read %s (%s): executors are not retired for their memory",
                    self._statm,
                    exc,
                )
            return None
