"""ExecutorGauge: an executor's CPU and memory as the kernel accounts them, read
from outside the process (here: of real child processes)."""

from __future__ import annotations

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
    before = gauge.cpu_ns()
    assert before is not None
    assert child.stdout is not None
    assert child.stdout.readline() == b"spun\n"
    after = gauge.cpu_ns()
    assert after is not None
    assert after > before
    rss = gauge.rss_bytes()
    assert rss is not None
    assert rss > 0


def test_a_process_that_is_gone_reads_as_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    gauge = ExecutorGauge(proc.pid)
    assert gauge.rss_bytes() is None
