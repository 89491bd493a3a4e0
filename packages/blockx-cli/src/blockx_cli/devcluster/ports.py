"""The local cluster's TCP ports: free ones unless a flag fixes one.

A fixed port is checked before anything starts, so a port already in use is one
line naming it and its flag, not a child that dies half-way through start-up.
A free port is drawn from 10,000-19,999, below the kernel's ephemeral range: a
port from that range (what binding port 0 gives) can be taken by any outgoing
connection of any program between the check and the child's bind, which on a busy
machine happens. A port another program binds in that window is reported as the
child's own bind failure.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path
from typing import Final

from blockx_cli.devcluster.processes import LaunchError

HOST = "127.0.0.1"
# Where free ports are drawn from: above the well-known and common service ports,
# below 20,000 (the ports from there up to the ephemeral range are left to other
# programs that choose theirs the same way, the test suite's servers among them)
# and below the kernel's ephemeral range (read at start, this when it cannot be).
_LOWEST: Final = 10_000
_HIGHEST: Final = 20_000
_EPHEMERAL_START: Final = 32_768
_EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _drawn_from() -> range:
    try:
        start = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        start = _EPHEMERAL_START
    return range(_LOWEST, max(min(start, _HIGHEST), _LOWEST + 1_000))


def _binds(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port no one listens on, below the ephemeral range (port 0's when none is)."""
    ports = _drawn_from()
    for _ in range(100):
        port = random.choice(ports)
        if _binds(port):
            return port
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def check_port_free(port: int, flag: str) -> None:
    """LaunchError when ``port`` cannot be bound on 127.0.0.1 (as the servers bind it)."""
    with socket.socket() as sock:
        # As asyncio's servers do: a port left in TIME_WAIT by an earlier run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(f"port {port} ({flag}) is already in use") from None
            raise LaunchError(f"cannot use port {port} ({flag}): {exc.strerror}") from None


def resolve_port(fixed: int | None, flag: str) -> int:
    """``fixed`` after checking it is free, else a free port."""
    if fixed is None:
        return free_port()
    check_port_free(fixed, flag)
    return fixed
