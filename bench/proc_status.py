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
