"""The executor's heartbeat thread: what is on the CPU now, for the Worker's watchdog.

A call that never ends cannot report itself, so a second thread does: every
interval it reads the main thread's CPU clock and sends an ``ExecutorHeartbeat``
with the running call and the budget it has used so far (the current segment
included), the number of suspended calls and the process's resident memory.
"""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Callable

from blockx_executor.protocol import ExecutorHeartbeat, FrameEncoder

# (call_id, CPU clock at segment start, budget consumed before the segment) of the
# call on the CPU (None: none), and how many calls are suspended.
RunningState = Callable[[], tuple[tuple[int, int, int] | None, int]]


def heartbeat_loop(
    sock: socket.socket,
    send_lock: threading.Lock,
    interval_s: float,
    stopped: threading.Event,
    state: RunningState,
) -> None:
    encoder = FrameEncoder()  # msgspec encoders are not shared across threads
    main = threading.main_thread().ident
    assert main is not None
    cpu_clock = time.pthread_getcpuclockid(main)
    # The first beat goes out at once: the Worker is not ready until it arrives.
    while True:
        running, suspended = state()
        call_id, used_ns = 0, 0
        if running is not None:
            call_id, since, before = running
            used_ns = before + (time.clock_gettime_ns(cpu_clock) - since)
        beat = ExecutorHeartbeat(call_id, used_ns // 1000, suspended, _rss_bytes())
        frame = encoder.encode([beat])
        try:
            with send_lock:
                sock.sendall(frame)
        except OSError:
            return
        if stopped.wait(interval_s):
            return


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0
