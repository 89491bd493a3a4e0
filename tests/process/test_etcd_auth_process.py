"""etcd with TLS (client certificates required) and authentication on: a Worker and a
Coordinator with their own etcd users place and run a task; clients without
credentials, with a reader's credentials or with a wrong password are refused;
bad security settings stop start-up with one line; an expired auth token leads to
a reconnect."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aetcd
import aetcd.exceptions
import pytest
from certs import Pki, make_pki
from grpclib.client import Channel
from grpclib.const import Status
from processes import EXAMPLES, CoordinatorProcess, WorkerProcess, call_list_task, execute_result
from support import wait_until

from blockx_client import ConnectError, EtcdAccess, list_workers
from blockx_proto import worker_v1
from blockx_server.etcd.heartbeat import EtcdHeartbeatPublisher, HeartbeatPublisherConfig
from blockx_server.etcd.local import EtcdServer, EtcdServerTls, find_etcd_binary
from blockx_server.etcd.security import EtcdSecurity, open_client
from blockx_server.runtime.clock import SystemClock

PREFIX = "/blockx/workers/"
PASSWORDS = {"root": "root-pw", "worker": "worker-pw", "coordinator": "coordinator-pw"}


class SecureEtcd:
    def __init__(self, server: EtcdServer, pki: Pki) -> None:
        self.server = server
        self.pki = pki

    def security(self, user: str | None = None, password: str | None = None) -> EtcdSecurity:
        return EtcdSecurity(
            ca_file=str(self.pki.ca),
            cert_file=str(self.pki.client.cert),
            key_file=str(self.pki.client.key),
            username=user,
            password=PASSWORDS.get(user or "") if password is None else password,
        )

    def env(self, user: str, password: str | None = None) -> dict[str, str]:
        security = self.security(user, password)
        return {
            "ETCD_ENDPOINTS": self.server.endpoint,
            "ETCD_CA_FILE": str(security.ca_file),
            "ETCD_CERT_FILE": str(security.cert_file),
            "ETCD_KEY_FILE": str(security.key_file),
            "ETCD_USERNAME": user,
            "ETCD_PASSWORD": str(security.password),
        }

    def client(self, user: str | None = None, password: str | None = None) -> aetcd.Client:
        host, port = self.server.endpoint.split(":")
        return open_client(
            host, int(port), timeout_s=5, options={}, security=self.security(user, password)
        )


def _etcdctl(etcd: EtcdServer, pki: Pki, *args: str) -> None:
    etcdctl = find_etcd_binary().parent / "etcdctl"
    if not etcdctl.is_file():
        pytest.skip(f"no etcdctl next to {find_etcd_binary()}")
    subprocess.run(
        [
            str(etcdctl),
            f"--endpoints={etcd.client_url}",
            f"--cacert={pki.ca}",
            f"--cert={pki.client.cert}",
            f"--key={pki.client.key}",
            *args,
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


async def start_secure_etcd(tmp_path: Path, *extra_args: str) -> tuple[EtcdServer, Pki]:
    pki = make_pki(tmp_path / "pki")
    tls = EtcdServerTls(
        cert_file=pki.server.cert,
        key_file=pki.server.key,
        ca_file=pki.ca,
        probe_cert_file=pki.client.cert,
        probe_key_file=pki.client.key,
    )
    server = EtcdServer(tls=tls, extra_args=extra_args)
    await server.start()
    # The roles docs/operations.md recommends: Workers write the registry, the
    # Coordinators and clients only read it.
    for command in (
        ["user", "add", f"root:{PASSWORDS['root']}", "--interactive=false"],
        ["user", "grant-role", "root", "root"],
        ["role", "add", "registry-writer"],
        ["role", "grant-permission", "registry-writer", "--prefix=true", "readwrite", PREFIX],
        ["role", "add", "registry-reader"],
        ["role", "grant-permission", "registry-reader", "--prefix=true", "read", PREFIX],
        ["user", "add", f"worker:{PASSWORDS['worker']}", "--interactive=false"],
        ["user", "grant-role", "worker", "registry-writer"],
        ["user", "add", f"coordinator:{PASSWORDS['coordinator']}", "--interactive=false"],
        ["user", "grant-role", "coordinator", "registry-reader"],
        ["auth", "enable"],
    ):
        _etcdctl(server, pki, *command)
    return server, pki


@pytest.fixture
async def secure_etcd(tmp_path: Path) -> AsyncIterator[SecureEtcd]:
    server, pki = await start_secure_etcd(tmp_path)
    yield SecureEtcd(server, pki)
    await server.close()


async def test_a_worker_and_a_coordinator_place_a_task_over_tls_and_auth(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    worker = WorkerProcess(
        {**secure_etcd.env("worker"), "WORKER_HEARTBEAT_INTERVAL": "100"},
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(secure_etcd.env("coordinator"), tmp_path / "coord.log")
    try:
        await worker.wait_ready()
        await coordinator.wait_serving()

        async def reserved() -> bool:
            return await coordinator.status_of("t-secure") is Status.OK

        await wait_until(reserved, "a reservation over the secured registry", timeout=30)
        reservation = await coordinator.reserve("t-secure")
        assert reservation.worker_addr == worker.addr
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            task = call_list_task("t-secure", "hello_world", [["tls"]])
            await stub.submit_task(
                worker_v1.SubmitTaskRequest(task=task, slot_id=reservation.slot_id), timeout=10
            )
            async with asyncio.timeout(60):
                updates = [
                    u
                    async for u in stub.watch_tasks(
                        worker_v1.WatchTasksRequest(task_ids=[task.task_id])
                    )
                ]
        finally:
            channel.close()
        assert updates[-1].state is worker_v1.TaskState.SUCCEEDED
        [plugin] = execute_result(updates[-1]).plugin_results
        assert json.loads(plugin.result) == ["hello, tls"]

        # The CLI's reader, with the Coordinator's read-only user, sees the Worker.
        access = EtcdAccess(
            ca_file=str(secure_etcd.pki.ca),
            cert_file=str(secure_etcd.pki.client.cert),
            key_file=str(secure_etcd.pki.client.key),
            username="coordinator",
            password=PASSWORDS["coordinator"],
        )
        found = await list_workers([secure_etcd.server.endpoint], [PREFIX], access=access)
        assert [w.heartbeat.worker_addr for w in found] == [worker.addr]
    finally:
        assert coordinator.stop() == 0
        assert worker.stop() == 0
    assert "Traceback" not in worker.output()
    assert "Traceback" not in coordinator.output()


async def test_clients_without_credentials_cannot_read_or_write_the_registry(
    secure_etcd: SecureEtcd,
) -> None:
    forged = b'{"workerAddr":"10.6.6.6:1","taskSlots":99}'
    # TLS with a valid client certificate but no user: etcd refuses reads and writes.
    anonymous = secure_etcd.client()
    try:
        with pytest.raises(aetcd.exceptions.ClientError):
            await anonymous.put(f"{PREFIX}10.6.6.6:1".encode(), forged)
        with pytest.raises(aetcd.exceptions.ClientError):
            await anonymous.get_prefix(PREFIX.encode())
    finally:
        await anonymous.close()
    # A reader may read but not forge a heartbeat.
    reader = secure_etcd.client("coordinator")
    try:
        await reader.get_prefix(PREFIX.encode())
        with pytest.raises(aetcd.exceptions.ClientError, match="permission denied"):
            await reader.put(f"{PREFIX}10.6.6.6:1".encode(), forged)
    finally:
        await reader.close()
    # Plaintext to the TLS port gets no answer at all.
    host, port = secure_etcd.server.endpoint.split(":")
    plain = aetcd.Client(host=host, port=int(port), timeout=2)
    try:
        with pytest.raises(aetcd.exceptions.ClientError):
            await plain.get_prefix(PREFIX.encode())
    finally:
        await plain.close()
    # The client SDK without credentials: one clear error.
    tls_only = EtcdAccess(
        ca_file=str(secure_etcd.pki.ca),
        cert_file=str(secure_etcd.pki.client.cert),
        key_file=str(secure_etcd.pki.client.key),
    )
    with pytest.raises(ConnectError, match="cannot read the registry"):
        await list_workers([secure_etcd.server.endpoint], [PREFIX], access=tls_only)


async def test_a_wrong_password_is_one_clear_line(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    client = secure_etcd.client("worker", "not-the-password")
    try:
        with pytest.raises(aetcd.exceptions.ClientError) as refused:
            await client.get_prefix(PREFIX.encode())
    finally:
        await client.close()
    message = str(refused.value)
    assert "'worker'" in message
    assert "ETCD_USERNAME / ETCD_PASSWORD" in message
    assert "\n" not in message

    coordinator = CoordinatorProcess(
        secure_etcd.env("coordinator", "not-the-password"), tmp_path / "coord.log"
    )
    try:

        def refused_logged() -> bool:
            return "etcd refused user 'coordinator'" in coordinator.output()

        await wait_until(refused_logged, "the refusal in the Coordinator's log", timeout=30)
    finally:
        coordinator.stop()
    [line, *_] = [line for line in coordinator.output().splitlines() if "etcd refused user" in line]
    assert "ETCD_USERNAME / ETCD_PASSWORD" in line
    assert "authentication failed" in line

    cli = await asyncio.to_thread(
        subprocess.run,
        ["blockx", "--etcd", secure_etcd.server.endpoint, "workers"],
        env={**os.environ, **secure_etcd.env("coordinator", "not-the-password")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 3, cli
    assert "etcd refused user 'coordinator'" in cli.stderr + cli.stdout


@pytest.mark.parametrize(
    ("given", "variable"),
    [
        ({"ETCD_USERNAME": "worker", "ETCD_PASSWORD": "pw"}, "ETCD_PASSWORD"),
        ({"ETCD_CA_FILE": "{ca}", "ETCD_CERT_FILE": "{ca}"}, "ETCD_KEY_FILE"),
        ({"ETCD_CA_FILE": "{ca}", "ETCD_USERNAME": "worker"}, "ETCD_PASSWORD"),
        ({"ETCD_CA_FILE": "/nonexistent/ca.pem"}, "ETCD_CA_FILE"),
    ],
)
@pytest.mark.parametrize("program", ["blockx-worker", "blockx-coordinator"])
def test_bad_etcd_security_settings_stop_start_up_with_one_line(
    program: str, given: dict[str, str], variable: str, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked before start-up\n")
    # Everything else is valid, so the one line is about etcd.
    env = {"FUNCTIONS_DIR": str(EXAMPLES / "functions")}
    env |= {k: v.format(ca=ca) for k, v in given.items()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    result = subprocess.run(
        [program], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]


async def test_an_expired_auth_token_leads_to_a_reconnect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Tokens live one second unless used; heartbeats two seconds apart always find
    # theirs expired.
    server, pki = await start_secure_etcd(tmp_path, "--auth-token-ttl=1")
    etcd = SecureEtcd(server, pki)
    publisher = EtcdHeartbeatPublisher(
        HeartbeatPublisherConfig(
            endpoints=(server.endpoint,),
            registry_prefix=PREFIX,
            worker_addr="127.0.0.1:7001",
            interval_ms=2_000,
            retry_delay_ms=50,
            security=etcd.security("worker"),
        ),
        _Idle(),
        SystemClock(),
    )
    caplog.set_level(logging.WARNING, "blockx_server.etcd.heartbeat")
    task = asyncio.create_task(publisher.run())
    try:

        def kept_publishing() -> bool:
            return publisher.published >= 4

        await wait_until(kept_publishing, "heartbeats across token expiries", timeout=60)
        assert not task.done()
        reader = etcd.client("coordinator")
        try:
            stored = await reader.get(publisher.key.encode())
        finally:
            await reader.close()
        assert stored is not None
        assert publisher.leases_granted == 1
    finally:
        await publisher.deregister()
        await task
        await server.close()
    expiries = [r for r in caplog.records if "invalid auth token" in r.getMessage()]
    assert expiries, [r.getMessage() for r in caplog.records]
    assert publisher.failures == len(expiries)


class _Idle:
    def heartbeat_counts(self, now_ms: int) -> tuple[int, int, int]:
        return (1, 0, 0)

    def error_rate(self, now_ms: int) -> float:
        return 0.0
