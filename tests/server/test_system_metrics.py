"""SystemMetrics with real processes: the process tree it sums, and the smoothed CPU."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from blockx_server.runtime.system import (
    CpuSmoother,
    SystemMetrics,
    descendant_pids,
    proc_children_supported,
)

MB = 1 << 20

# A child that starts a grandchild holding 50 MB, prints both pids, and waits.
_TREE = f"""
import subprocess, sys
grandchild = subprocess.Popen(
    [sys.executable, "-c", "import sys; b = b'x' * {50 * MB}; print('ready', flush=True); "
     "sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
)
assert grandchild.stdout.readline() == b"ready\\n"
print(grandchild.pid, flush=True)
sys.stdin.read()
grandchild.kill()
grandchild.wait()
"""

needs_proc_children = pytest.mark.skipif(
    not proc_children_supported(), reason="no /proc/<pid>/task/<tid>/children on this kernel"
)


def wait_gone(pid: int) -> None:
    """Wait for a grandchild to exit: it reads its stdin, which closes with its parent."""
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        yield child, grandchild
    finally:
        child.kill()
        child.wait()
        wait_gone(grandchild)


@needs_proc_children
def test_descendant_pids_match_psutils_walk(tree: tuple[subprocess.Popen[bytes], int]) -> None:
    child, grandchild = tree
    ours = set(descendant_pids(os.getpid()))
    assert {child.pid, grandchild} <= ours
    assert ours == {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize(
    "use_proc_children",
    [pytest.param(True, marks=needs_proc_children), False],
    ids=["proc-children", "psutil-walk"],
)
def test_tree_rss_counts_grandchildren_and_drops_exited_ones(use_proc_children: bool) -> None:
    metrics = SystemMetrics(use_proc_children=use_proc_children)
    before = metrics.process_tree_rss_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    assert child.stdin is not None
    grandchild = int(child.stdout.readline())
    try:
        with_tree = metrics.process_tree_rss_bytes()
        assert with_tree - before >= 25 * MB, "the grandchild's 50 MB were not counted"
        # Read again from the kept handles: the same tree, the same order of size.
        assert metrics.process_tree_rss_bytes() - before >= 25 * MB
    finally:
        child.stdin.close()  # the child kills its grandchild and exits
        child.wait()
        wait_gone(grandchild)
    after = metrics.process_tree_rss_bytes()
    assert after - before < 25 * MB, "an exited process is still counted"


def test_one_busy_interval_does_not_reach_the_red_line() -> None:
    smoother = CpuSmoother(time_constant_s=1.0)
    assert smoother.value is None
    assert smoother.update(0.3, 0.2) == pytest.approx(0.3)  # the first sample as it is
    spiked = smoother.update(1.0, 0.2)  # one 200 ms interval at 100%
    assert 0.3 < spiked < 0.9
    for _ in range(50):  # ten seconds of sustained full load
        smoothed = smoother.update(1.0, 0.2)
    assert smoothed > 0.99
    for _ in range(50):
        smoothed = smoother.update(0.1, 0.2)
    assert smoothed == pytest.approx(0.1, abs=0.01)


def test_smoothing_weighs_samples_by_the_time_they_span() -> None:
    short, long = CpuSmoother(1.0), CpuSmoother(1.0)
    short.update(0.0, 0.2)
    long.update(0.0, 0.2)
    # A sample spanning ten time constants all but replaces the mean; a short one moves it
    # a little.
    assert long.update(1.0, 10.0) > 0.99
    assert short.update(1.0, 0.05) < 0.1
    with pytest.raises(ValueError, match="time_constant_s"):
        CpuSmoother(0.0)


def test_smoothed_cpu_is_a_fraction() -> None:
    metrics = SystemMetrics(cpu_smoothing_s=0.5)
    for _ in range(3):
        assert 0.0 <= metrics.cpufraction() <= 1.0
        assert 0.0 <= metrics.raw_cpu_fraction() <= 1.0
