"""The local cluster's TCP ports: free ones unless a flag fixes one.

A fixed port is checked before anything starts, so a port already in use is one
line naming it and its flag, not a child that dies half-way through start-up.
A free port is one the kernel hands out for port 0; between the check and the
child's bind another program could take it, which on a development machine is
rare enough to be reported as the child's own bind failure.
"""

from __future__ import annotations

import errno
import socket

from blockx_cli.devcluster.processes import LaunchError

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


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
