"""What every BlockX process does at start and exit: its command line, its
configuration, logging, profiling, fatal errors."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import ctypes
import importlib.metadata
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from blockx_core.environ import EnvironOverFile
from blockx_server.runtime.config_file import ConfigFileError, read_config_file
from blockx_server.runtime.env import ConfigError, Environ, each_error
from blockx_server.runtime.logs import LOG_SETTINGS, configure_logging, read_log_settings
from blockx_server.runtime.settings import Setting
from blockx_server.runtime.tracing import configure_tracing


class StartupError(Exception):
    """Start-up cannot go on; ``str()`` is the one line users see."""


def fail(program: str, message: str, *more: str) -> NoReturn:
    """One line per message on stderr and a non-zero exit; never a traceback."""
    for line in (message, *more):
        print(f"{program}: {line}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class _Logged(Protocol):
    @property
    def log_level(self) -> str: ...


C = TypeVar("C", bound=_Logged)


def start_program(
    program: str,
    summary: str,
    settings: Sequence[Setting[Any]],
    load: Callable[[Environ], C],
    argv: Sequence[str] | None = None,
    tables: Sequence[str] = (),
) -> C:
    """What a server program does before it serves.

    ``--help`` and ``--version`` answer and exit 0; ``--config FILE`` reads settings
    from a TOML file under the environment (``config_file``; ``tables`` are the
    tables of tables the program reads, ``chains``); any other argument is
    one usage line and exit 2. Then the configuration (the logging settings of
    ``runtime/logs.py`` included) is read and validated before anything is logged:
    every bad variable (or key of the file) is one line on stderr, and the exit code
    is 2. Logging is configured last, at the configured level and format.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    config_path: str | None = None
    match args:
        case []:
            pass
        case ["--help" | "-h"]:
            print(program_help(program, summary, [*settings, *LOG_SETTINGS]), end="", flush=True)
            raise SystemExit(0)
        case ["--version"]:
            print(f"{program} {package_version()}", flush=True)
            raise SystemExit(0)
        case ["--config", path] if path:
            config_path = path
        case [arg] if arg.startswith("--config=") and arg != "--config=":
            config_path = arg.removeprefix("--config=")
        case _:
            print(
                f"usage: {program} [--help | --version], {program} [--config FILE] "
                f"(unknown arguments: {' '.join(args)})",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)
    environ: Environ = os.environ
    if config_path is not None:
        try:
            known = [s.name for s in (*settings, *LOG_SETTINGS)]
            file = read_config_file(Path(config_path), known, tables)
        except ConfigFileError as exc:
            fail(program, *(f"invalid configuration: {line}" for line in exc.lines))
        environ = EnvironOverFile(os.environ, file)
    errors: list[ConfigError] = []
    config = _read(load, environ, errors)
    log_settings = _read(read_log_settings, environ, errors)
    if config is None or log_settings is None:
        fail(program, *(_invalid(error, environ, config_path) for error in errors))
    configure_logging(config.log_level, log_settings)
    configure_tracing(program)
    return config


def configuration_errors(load: Callable[[Environ], object], environ: Environ) -> list[ConfigError]:
    """Every bad variable ``start_program`` would refuse ``environ`` for, given the
    program's ``load``: its own configuration's, then the logging settings' (none:
    it would start). A launcher checks its children with it before starting any."""
    errors: list[ConfigError] = []
    _read(load, environ, errors)
    _read(read_log_settings, environ, errors)
    return errors


T = TypeVar("T")


def _read(read: Callable[[Environ], T], environ: Environ, errors: list[ConfigError]) -> T | None:
    """``read(environ)``, or None with each bad variable added to ``errors``."""
    try:
        return read(environ)
    except ConfigError as exc:
        errors += each_error(exc)
        return None


def _invalid(error: ConfigError, environ: Environ, config_path: str | None) -> str:
    """One line for a bad value, saying so when it came from the file."""
    line = f"invalid configuration: {error}"
    if isinstance(environ, EnvironOverFile) and environ.from_file(error.variable):
        line += f" (in {config_path})"
    return line


def program_help(program: str, summary: str, settings: Sequence[Setting[Any]]) -> str:
    """``--help``: the usage and every environment variable ``program`` reads."""
    lines = [
        f"usage: {program} [--help | --version]",
        f"       {program} [--config FILE]",
        "",
        summary,
        "",
        "Configured by environment variables; unset or blank means the default. A bad",
        "value stops start-up with one line per bad variable and exit code 2.",
        "--config FILE reads them from a TOML file too, keyed by these names",
        '(TASK_SLOTS = 50, ETCD_ENDPOINTS = ["a:2379", "b:2379"]); a variable set in',
        "the environment wins over the file, and a key not listed here stops start-up.",
        "",
    ]
    for setting in settings:
        lines.append(f"  {setting.name} (default: {setting.default_text()})")
        lines.append(f"      {setting.help}")
    return "\n".join(lines) + "\n"


def package_version() -> str:
    """The installed version of blockx-server."""
    try:
        return importlib.metadata.version("blockx-server")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
        log = logging.getLogger(__name__)
        try:
            profiler.dump_stats(path)
        except OSError as exc:
            # The process's work is done: a profile that cannot be written is no
            # reason to end in a traceback, nor to blame what the process served.
            log.error("CPU profile not written to %s: %s", path, exc)
        else:
            log.info("CPU profile written to %s", path)


def signal_child(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    """Signal a child process unless it has exited.

    Not ``Process.send_signal()`` / ``kill()``: those poll (waitpid) first, which can
    reap the child under asyncio's child watcher; the watcher then logs it as an
    unknown child and reports exit code 255.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stopped_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child that must not outlive the process starting it,
    even one killed by SIGKILL: Linux sends the child SIGTERM when that process ends
    (None elsewhere). The signal follows the thread that forks, so start such a
    child from the thread that lives as long as the process (the event loop's)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the prctl took hold
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT, SIGTERM or SIGHUP (its terminal closed): the way every
    BlockX process is told to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop
