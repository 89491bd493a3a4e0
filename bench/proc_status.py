"""Figures of a process read from ``/proc/<pid>/status``, for the benchmarks."""

from __future__ import annotations

from pathlib import Path


def status_kb(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``, ...); 0 once the
    process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, from the scheduler's own figures
    (``/proc/<pid>/task/*/schedstat``, nanoseconds); 0 once the process is gone."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def children(pid: int) -> list[int]:
    """The direct children of ``pid``'s main thread."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]
