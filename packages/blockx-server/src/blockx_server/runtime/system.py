"""What the host and this process use: CPU, memory, and the RSS of the process tree.

Read with psutil for the Worker's heartbeat; every figure is clamped to the range
the heartbeat accepts.
"""

from __future__ import annotations

import contextlib
import math
from typing import Final

import msgspec
import psutil

_MAX_INT64: Final = 2**63 - 1


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


class SystemMetrics:
    """Host CPU and memory, and the RSS of this process and all its descendants
    (the executors are child processes), read with psutil."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        # The first cpu_percent(interval=None) has nothing to compare with and
        # returns 0.0; priming it makes the first heartbeat's figure meaningful.
        psutil.cpu_percent(interval=None)

    def cpufraction(self) -> float:
        """System-wide CPU use since the previous call, in [0, 1].

        psutil keeps one "previous call" per Python process, shared by every caller
        of ``psutil.cpu_percent(interval=None)``.
        """
        return fraction(psutil.cpu_percent(interval=None) / 100)

    def process_tree_rss_bytes(self) -> int:
        """RSS of this process plus every descendant still alive."""
        total = self._process.memory_info().rss
        for child in self._process.children(recursive=True):
            # A child may exit (or turn zombie) between listing and reading it.
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return non_negative(total)

    def sample(self) -> SystemSample:
        memory = psutil.virtual_memory()
        return SystemSample(
            cpu_fraction=self.cpufraction(),
            memory_fraction=fraction(memory.percent / 100),
            memory_available_bytes=non_negative(memory.available),
            memory_total_bytes=non_negative(memory.total),
            process_rss_bytes=self.process_tree_rss_bytes(),
        )
