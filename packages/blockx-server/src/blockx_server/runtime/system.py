"""What the host and this process use: CPU, memory, and the RSS of the process tree.

Read with psutil for the Worker's heartbeat; every figure is clamped to the range
the heartbeat accepts. A sample costs in proportion to the Worker's own process tree,
not to the number of processes on the host: descendants are found through Linux's
``/proc/<pid>/task/<tid>/children`` lists, and their psutil handles are kept between
samples (psutil's ``children(recursive=True)`` reads every process on the host to
build a parent map, about 1.5 ms on a quiet machine and more on a busy one). Where
those lists do not exist (another OS, a kernel without CONFIG_PROC_CHILDREN), the
psutil walk is used.

The CPU figure is an exponentially weighted mean with a time constant of
``cpu_smoothing_s``: a single busy interval does not push a Worker over the
Coordinator's CPU red line, a sustained load does within a few time constants.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Final

import msgspec
import psutil

_MAX_INT64: Final = 2**63 - 1
# About five heartbeats at the default 200 ms; at a 2 s interval each sample already
# spans more than this, and the smoothing barely changes it.
DEFAULT_CPU_SMOOTHING_S: Final = 1.0


class SystemSample(msgspec.Struct, frozen=True, kw_only=True):
    """Host and process figures for one heartbeat, in the ranges it accepts."""

    cpu_fraction: float
    memory_fraction: float
    memory_available_bytes: int
    memory_total_bytes: int
    process_rss_bytes: int


def fraction(value: float) -> float:
    if math.isnan(value):
        return 0.0
    return min(max(value, 0.0), 1.0)


def non_negative(value: int) -> int:
    return min(max(value, 0), _MAX_INT64)


def proc_children_supported() -> bool:
    """Whether this kernel lists a thread's children under /proc (CONFIG_PROC_CHILDREN)."""
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def descendant_pids(root: int) -> list[int]:
    """Every live descendant of ``root``, from /proc children lists (Linux only).

    A process that exits while it is being read simply drops out of the answer.
    """
    found: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as listing:
                    children = listing.read().split()
            except OSError:
                continue
            for child in children:
                found.append(int(child))
                stack.append(int(child))
    return found


class CpuSmoother:
    """Exponentially weighted mean of CPU fractions sampled at uneven intervals."""

    def __init__(self, time_constant_s: float) -> None:
        if not time_constant_s > 0:
            raise ValueError(f"time_constant_s must be > 0 (got {time_constant_s})")
        self._time_constant_s = time_constant_s
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        return self._value

    def update(self, sample: float, elapsed_s: float) -> float:
        """Fold in ``sample``, the mean over the last ``elapsed_s``; the first sample
        is taken as it is."""
        if self._value is None:
            self._value = sample
        else:
            weight = 1.0 - math.exp(-max(elapsed_s, 0.0) / self._time_constant_s)
            self._value += weight * (sample - self._value)
        return self._value


class SystemMetrics:
    """Host CPU and memory, and the RSS of this process and all its descendants
    (the executors are child processes), read with psutil."""

    def __init__(
        self,
        *,
        cpu_smoothing_s: float = DEFAULT_CPU_SMOOTHING_S,
        use_proc_children: bool | None = None,
    ) -> None:
        self._process = psutil.Process()
        self._use_proc_children = (
            proc_children_supported() if use_proc_children is None else use_proc_children
        )
        # psutil handles of the descendants seen at the last sample, by pid.
        self._children: dict[int, psutil.Process] = {}
        self._cpu = CpuSmoother(cpu_smoothing_s)
        # The first cpu_percent(interval=None) has nothing to compare with and
        # returns 0.0; priming it makes the first heartbeat's figure meaningful.
        psutil.cpu_percent(interval=None)
        self._cpu_read_at = time.monotonic()

    def raw_cpu_fraction(self) -> float:
        """System-wide CPU use since the previous call, in [0, 1], unsmoothed.

        psutil keeps one "previous call" per Python process, shared by every caller
        of ``psutil.cpu_percent(interval=None)``.
        """
        return fraction(psutil.cpu_percent(interval=None) / 100)

    def cpufraction(self) -> float:
        """System-wide CPU use, smoothed over ``cpu_smoothing_s``, in [0, 1]."""
        raw = self.raw_cpu_fraction()
        now = time.monotonic()
        elapsed_s, self._cpu_read_at = now - self._cpu_read_at, now
        return fraction(self._cpu.update(raw, elapsed_s))

    def process_tree_rss_bytes(self) -> int:
        """RSS of this process plus every descendant still alive."""
        total = self._process.memory_info().rss
        for child in self._descendants():
            # A child may exit (or turn zombie) between listing and reading it.
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return non_negative(total)

    def _descendants(self) -> list[psutil.Process]:
        if not self._use_proc_children:
            return self._process.children(recursive=True)
        pids = descendant_pids(self._process.pid)
        known = self._children
        current: dict[int, psutil.Process] = {}
        for pid in pids:
            handle = known.get(pid)
            if handle is None:
                try:
                    handle = psutil.Process(pid)
                except psutil.Error:
                    continue  # exited since it was listed
            current[pid] = handle
        # Pids that disappeared drop out here; a reused pid is listed only if the
        # new process is a descendant too, and its RSS is what /proc reports now.
        self._children = current
        return list(current.values())

    def sample(self) -> SystemSample:
        memory = psutil.virtual_memory()
        return SystemSample(
            cpu_fraction=self.cpufraction(),
            memory_fraction=fraction(memory.percent / 100),
            memory_available_bytes=non_negative(memory.available),
            memory_total_bytes=non_negative(memory.total),
            process_rss_bytes=self.process_tree_rss_bytes(),
        )
