"""Hosts of their own: one network namespace per process, all on one bridge.

Each host is a namespace ``bxf-<pid>-<name>`` with ``lo`` up and one end of a veth
pair (``eth0``, an address on a private /24); the other end is a port of the
bridge ``bxf<pid>``, which also carries the test process's own address on that
/24, so the test (in the root namespace) reaches every host and every host
reaches every other. ``cut`` sets the host's bridge-side veth down: its links to
everyone (etcd, coordinators, clients) go silent at once, as a pulled cable does,
and TCP connections resume where they stopped when ``heal`` sets it up again.

Everything is named after the test process's pid, so ``remove_leftovers`` can
delete what a killed run left behind without touching a live run's namespaces.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Final

PREFIX: Final = "bxf"
_LINK: Final = re.compile(rf"^\d+: ({PREFIX}(\d+)[a-z0-9]*)[@:]")
_NETNS: Final = re.compile(rf"^({PREFIX}-(\d+)-\S+)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (not root, no ``ip``, the kernel refuses),
    or None when a throw-away namespace with a veth pair could be made."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        veth = _ip(
            "link", "add", f"{PREFIX}{os.getpid()}p", "type", "veth", "peer", "name", "eth0",
            "netns", probe, check=False,
        )  # fmt: skip
        if veth.returncode != 0:
            return f"ip link add type veth failed: {veth.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)  # deletes the veth pair with it


def remove_leftovers() -> list[str]:
    """Delete the namespaces and links of runs whose process is gone; their names."""
    removed: list[str] = []
    for line in _ip("netns", "list").stdout.splitlines():
        match = _NETNS.match(line)
        if match and not _pid_alive(int(match[2])):
            _ip("netns", "del", match[1], check=False)
            removed.append(match[1])
    for line in _ip("-o", "link", "show").stdout.splitlines():
        match = _LINK.match(line)
        if match and not _pid_alive(int(match[2])):
            _ip("link", "del", match[1], check=False)
            removed.append(match[1])
    return removed


def _free_subnet() -> str:
    """A 10.213.X.0/24 no interface of this host has an address in: ``10.213.X``."""
    used = _ip("-o", "-4", "addr", "show").stdout
    for offset in range(250):
        third = (os.getpid() + offset) % 250 + 1
        base = f"10.213.{third}"
        if f" {base}." not in used:
            return base
    raise RuntimeError("no free 10.213.X.0/24 subnet")


class NetnsHost:
    """One namespace on the bridge: ``addr`` is its address, ``wrapper`` runs a
    program inside it."""

    def __init__(self, name: str, netns: str, addr: str, bridge_port: str) -> None:
        self.name = name
        self.netns = netns
        self.addr = addr
        self.bridge_port = bridge_port

    @property
    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns)


class Netns:
    """The bridge and the hosts of one test run; ``close`` removes them all."""

    def __init__(self) -> None:
        pid = os.getpid()
        self._pid = pid
        self.bridge = f"{PREFIX}{pid}"
        self._subnet = _free_subnet()
        self.gateway = f"{self._subnet}.1"
        self.hosts: dict[str, NetnsHost] = {}
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            _ip("link", "del", self.bridge, check=False)
            raise

    def add_host(self, name: str) -> NetnsHost:
        index = len(self.hosts) + 2
        netns = f"{PREFIX}-{self._pid}-{name}"
        port = f"{self.bridge}h{index}"
        host = NetnsHost(name, netns, f"{self._subnet}.{index}", port)
        _ip("netns", "add", netns)
        self.hosts[name] = host
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", port, "master", self.bridge)
        _ip("link", "set", port, "up")
        _ip("-n", netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        return host

    def cut(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].bridge_port, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].bridge_port, "up")

    def close(self) -> None:
        """Remove every veth pair, namespace and the bridge. The pairs go first and
        explicitly: a deleted namespace's devices are destroyed asynchronously."""
        for host in self.hosts.values():
            _ip("link", "del", host.bridge_port, check=False)
            _ip("netns", "del", host.netns, check=False)
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)
