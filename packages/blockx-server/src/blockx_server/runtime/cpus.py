"""How many CPUs this process can keep busy: its affinity, capped by its cgroup's
CPU quota.

A container limited to two CPUs' worth of time on a 64-CPU host has an affinity of
64 and a quota of two: running 64 busy processes there only makes them take turns.
The quota is read where Linux puts it: cgroup v2's ``cpu.max`` ("max" or
"QUOTA PERIOD") and cgroup v1's ``cpu.cfs_quota_us`` (-1: none) with
``cpu.cfs_period_us``, in this process's own cgroup directory and every one above it
up to the root (where a container mounts its own cgroup). A file that is missing or
unreadable sets no limit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """The CPUs this process may run on, at most its cgroup's quota (rounded up)."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(root, self_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The CPUs' worth of time the cgroup of this process, or one above it, may use:
    the least of their quotas (None: no limit)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            quotas += filter(None, (_v2(d / "cpu.max") for d in _up(root, path)))
        elif "cpu" in controllers.split(","):
            for base in {root / "cpu", root / controllers}:
                quotas += filter(None, (_v1(d) for d in _up(base, path)))
    return min(quotas, default=None)


def _up(base: Path, path: str) -> list[Path]:
    """The cgroup directory of ``path`` under ``base`` and every one above it."""
    directory = base / path.lstrip("/")
    return [directory, *(p for p in directory.parents if p.is_relative_to(base))]


def _v2(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
