"""The local cluster's free ports come from 10,000-19,999, below the kernel's
ephemeral range, where no outgoing connection can take one between the check and
the child's bind, and below the test suite's own servers' ports (20,000 up)."""

from __future__ import annotations

import socket
from pathlib import Path

from blockx_cli.devcluster.ports import HOST, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bind() -> None:
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < min(20_000, ephemeral_start)
        with socket.socket() as sock:
            sock.bind((HOST, port))  # nobody listens on it
