"""ExecutorGauge: an executor's CPU and memory as the kernel accounts them, read
from outside the process (here: of real child processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from blockx_server.calls.cpu_clock import ExecutorGauge

# Spins 200 ms of CPU on its main thread, says so, then waits for its stdin to close.
SPIN = (
    "import sys, time\n"
    "end = time.process_time() + 0.2\n"
    "while time.process_time() < end: pass\n"
    "print('spun', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    yield proc
    proc.kill()
    proc.wait()


def test_reads_the_cpu_a_child_spent_and_its_memory(child: subprocess.Popen[bytes]) -> None:
    gauge = ExecutorGauge(child.pid)
    before = gauge.cpu()
    assert before is not None
    assert child.stdout is not None
    assert child.stdout.readline() == b"spun\n"
    after = gauge.cpu()
    assert after is not None
    assert after.used_ns > before.used_ns
    # The wait for a CPU is read too: a clock that never runs backwards.
    assert before.waited_ns is not None
    assert after.waited_ns is not None
    assert after.waited_ns >= before.waited_ns
    rss = gauge.rss_bytes()
    assert rss is not None
    assert rss > 0


def test_a_process_that_is_gone_reads_as_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    gauge = ExecutorGauge(proc.pid)
    assert gauge.rss_bytes() is None


def _fresh_schedstat(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
        used, waited = f.read().split()[:2]
        return int(used), int(waited)


def test_the_kept_descriptor_reads_what_a_fresh_open_reads(
    child: subprocess.Popen[bytes],
) -> None:
    gauge = ExecutorGauge(child.pid)
    readings = []
    for _ in range(3):
        before = _fresh_schedstat(child.pid)
        kept = gauge.cpu()
        after = _fresh_schedstat(child.pid)
        assert kept is not None
        assert kept.waited_ns is not None
        assert before[0] <= kept.used_ns <= after[0]
        assert before[1] <= kept.waited_ns <= after[1]
        readings.append(kept.used_ns)
    assert child.stdout is not None
    assert child.stdout.readline() == b"spun\n"
    spun = gauge.cpu()
    assert spun is not None
    assert spun.used_ns > readings[-1]  # read afresh each time, not the first text again
    gauge.close()


def test_a_process_that_ends_after_its_first_sample_reads_as_nothing() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    gauge = ExecutorGauge(proc.pid)
    assert gauge.cpu() is not None
    assert gauge.rss_bytes() is not None
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait()
    assert gauge.cpu() is None
    assert gauge.rss_bytes() is None
    gauge.close()


def test_close_gives_the_descriptors_back(child: subprocess.Popen[bytes]) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    gauge = ExecutorGauge(child.pid)
    assert gauge.cpu() is not None
    assert gauge.rss_bytes() is not None
    assert len(os.listdir("/proc/self/fd")) == fds + 2
    gauge.close()
    assert len(os.listdir("/proc/self/fd")) == fds
