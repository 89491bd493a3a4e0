"""What every BlockX process does at start and exit: logging, profiling, fatal errors."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


class StartupError(Exception):
    """Start-up cannot go on; ``str()`` is the one line users see."""


def fail(program: str, message: str) -> NoReturn:
    """One line on stderr and a non-zero exit; never a traceback."""
    print(f"{program}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@contextmanager
def cpu_profile(path: str | None) -> Iterator[None]:
    """Profile the whole block (the process lifetime) and write pstats to ``path``."""
    if path is None:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)
        logging.getLogger(__name__).info("CPU profile written to %s", path)


def signal_child(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    """Signal a child process unless it has exited.

    Not ``Process.send_signal()`` / ``kill()``: those poll (waitpid) first, which can
    reap the child under asyncio's child watcher; the watcher then logs it as an
    unknown child and reports exit code 255.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the way every BlockX process is told to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
