"""mTLS on gRPC (GRPC_TLS_CERT_FILE, GRPC_TLS_KEY_FILE, GRPC_TLS_CA_FILE): a real
Worker and Coordinator and the client SDK, with certificates the test makes, place
and run tasks; a forged registry entry pointing at a server whose certificate the
CA did not sign never gets one; a client without a certificate is refused; a
plaintext client to a TLS server fails clearly; a proxy reaches TLS Workers."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aetcd
import pytest
from certs import Pki, make_pki
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.server import Server
from processes import ConsoleProcess, CoordinatorProcess, WorkerProcess
from support import free_port, heartbeat, wait_until

from blockx_client import Client, ConnectError, GrpcTls, Task, TaskState
from blockx_core.addr import WORKER_ADDR_HEADER
from blockx_core.heartbeat import encode_heartbeat
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def tls_env(pki: Pki) -> dict[str, str]:
    return {
        "GRPC_TLS_CERT_FILE": str(pki.server.cert),
        "GRPC_TLS_KEY_FILE": str(pki.server.key),
        "GRPC_TLS_CA_FILE": str(pki.ca),
    }


def client_tls(pki: Pki) -> GrpcTls:
    return GrpcTls(
        ca_file=str(pki.ca), cert_file=str(pki.client.cert), key_file=str(pki.client.key)
    )


async def wait_ready_over_tls(worker: WorkerProcess, context: ssl.SSLContext | None) -> None:
    async def serving() -> bool:
        worker.assert_alive()
        channel = Channel("127.0.0.1", worker.port, ssl=context)
        try:
            reply = await HealthStub(channel).Check(
                HealthCheckRequest(service=worker.service), timeout=5
            )
        except (TimeoutError, GRPCError, OSError):
            return False
        finally:
            channel.close()
        return bool(reply.status == HealthCheckResponse.SERVING)

    await wait_until(serving, "the TLS worker ready", timeout=30)


class _ImpostorWorker(worker_v1.WorkerServiceBase):
    """Grants every slot: a forged registry entry's server, counting what reaches it."""

    def __init__(self) -> None:
        self.requests = 0

    async def request_task_slot(
        self, message: worker_v1.RequestTaskSlotRequest
    ) -> worker_v1.TaskSnapshot:
        self.requests += 1
        return worker_v1.TaskSnapshot(task_id=message.task_id, slot_id="forged")

    async def submit_task(
        self, message: worker_v1.SubmitTaskRequest
    ) -> worker_v1.SubmitTaskResponse:
        self.requests += 1
        return worker_v1.SubmitTaskResponse(task_id=message.task.task_id if message.task else "")


@pytest.fixture
def tls_cluster(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], pki: Pki, tmp_path: Path
) -> Iterator[tuple[CoordinatorProcess, WorkerProcess, str]]:
    lane = unique_lane()
    worker = WorkerProcess(
        {
            **tls_env(pki),
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": lane,
            "WORKER_HEARTBEAT_INTERVAL": "100",
        },
        tmp_path / "worker.log",
    )
    coordinator = CoordinatorProcess(
        {
            **tls_env(pki),
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "COORDINATOR_REGISTRY_PREFIXES": lane,
        },
        tmp_path / "coordinator.log",
    )
    yield coordinator, worker, lane
    assert coordinator.stop() == 0
    assert worker.stop() == 0
    assert "Traceback" not in worker.output()
    assert "Traceback" not in coordinator.output()


async def test_tasks_run_over_mtls_and_a_forged_worker_fails_the_handshake(
    tls_cluster: tuple[CoordinatorProcess, WorkerProcess, str],
    etcd_server: EtcdServer,
    pki: Pki,
) -> None:
    coordinator, worker, lane = tls_cluster
    tls = client_tls(pki)
    await wait_ready_over_tls(worker, tls.ssl_context())

    # An attacker's server, its certificate from a CA the cluster does not trust,
    # advertised with a heartbeat far more attractive than the real Worker's.
    impostor = _ImpostorWorker()
    server = Server([impostor])
    impostor_port = free_port()
    stranger = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    stranger.load_cert_chain(str(pki.stranger.cert), str(pki.stranger.key))
    stranger.set_alpn_protocols(["h2"])
    hellos: list[str | None] = []
    # Called on every TLS ClientHello: the Coordinator did try the impostor.
    stranger.sni_callback = lambda _sock, name, _ctx: hellos.append(name)
    await server.start("127.0.0.1", impostor_port, ssl=stranger)
    impostor_addr = f"127.0.0.1:{impostor_port}"
    etcd = aetcd.Client(etcd_server.host, etcd_server.port, timeout=5)
    try:
        results = []
        async with Client(coordinator=f"127.0.0.1:{coordinator.port}", tls=tls) as client:
            for n in range(5):
                forged = heartbeat(impostor_addr, slots=1000, at_ms=int(time.time() * 1000))
                await etcd.put((lane + impostor_addr).encode(), encode_heartbeat(forged))
                task = Task.call_list("hello_world", [[f"n{n}"]], task_id=f"t-mtls-{n}")
                results.append(await client.run(task, deadline_s=60))
    finally:
        await etcd.delete((lane + impostor_addr).encode())
        await etcd.close()
        server.close()
        await server.wait_closed()
    assert [r.state for r in results] == [TaskState.SUCCEEDED] * 5
    assert {r.worker_addr for r in results} == {worker.addr}
    assert impostor.requests == 0
    assert hellos, "the Coordinator never tried the impostor"


async def test_a_client_without_a_certificate_or_without_tls_is_refused(
    tls_cluster: tuple[CoordinatorProcess, WorkerProcess, str], pki: Pki
) -> None:
    coordinator, worker, _ = tls_cluster
    await wait_ready_over_tls(worker, client_tls(pki).ssl_context())
    for tls in (GrpcTls(ca_file=str(pki.ca)), GrpcTls()):
        async with Client(coordinator=f"127.0.0.1:{coordinator.port}", tls=tls) as client:
            with pytest.raises(ConnectError) as refused:
                await client.get_task_result("t-refused", worker_addr=worker.addr)
            assert worker.addr in str(refused.value)
            with pytest.raises(ConnectError):
                await client.reserve_worker_slot("t-refused", deadline_s=2)
    # A certificate from another CA: refused as well.
    stranger = GrpcTls(
        ca_file=str(pki.ca), cert_file=str(pki.stranger.cert), key_file=str(pki.stranger.key)
    )
    async with Client(coordinator=f"127.0.0.1:{coordinator.port}", tls=stranger) as client:
        with pytest.raises(ConnectError):
            await client.get_task_result("t-refused", worker_addr=worker.addr)
    # A client that does not trust the cluster's CA refuses the server in turn.
    wrong_ca = GrpcTls(
        ca_file=str(pki.stranger_ca), cert_file=str(pki.client.cert), key_file=str(pki.client.key)
    )
    async with Client(coordinator=f"127.0.0.1:{coordinator.port}", tls=wrong_ca) as client:
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get_task_result("t-refused", worker_addr=worker.addr)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bxt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def proxy_channels() -> AsyncIterator[list[Channel]]:
    channels: list[Channel] = []
    yield channels
    for channel in channels:
        channel.close()


async def test_the_proxy_reaches_tls_workers_with_its_client_certificate(
    tls_cluster: tuple[CoordinatorProcess, WorkerProcess, str],
    etcd_server: EtcdServer,
    pki: Pki,
    socket_dir: Path,
    tmp_path: Path,
    proxy_channels: list[Channel],
) -> None:
    _, worker, lane = tls_cluster
    await wait_ready_over_tls(worker, client_tls(pki).ssl_context())
    socket_path = socket_dir / "p.sock"
    proxy = ConsoleProcess(
        "blockx-proxy",
        {
            "PROXY_SOCKET_PATH": str(socket_path),
            "PROXY_COORDINATOR_ADDR": f"127.0.0.1:{free_port()}",
            "PROXY_SYNC_INVOKER_ADDR": f"127.0.0.1:{free_port()}",
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "PROXY_REGISTRY_PREFIXES": lane,
            "GRPC_TLS_CA_FILE": str(pki.ca),
            "GRPC_TLS_CERT_FILE": str(pki.client.cert),
            "GRPC_TLS_KEY_FILE": str(pki.client.key),
        },
        tmp_path / "proxy.log",
    )
    try:
        channel = Channel(path=str(socket_path))
        proxy_channels.append(channel)
        stub = worker_v1.WorkerServiceStub(channel)

        async def worker_answers() -> bool:
            proxy.assert_alive()
            try:
                await stub.get_task_result(
                    worker_v1.GetTaskResultRequest(task_id="never-submitted"),
                    metadata={WORKER_ADDR_HEADER: worker.addr},
                    timeout=10,
                )
            except GRPCError as exc:
                return exc.status is Status.NOT_FOUND
            except OSError:
                return False
            return False

        await wait_until(worker_answers, "the TLS worker through the proxy", timeout=30)
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"GRPC_TLS_CERT_FILE": "{cert}"}, "GRPC_TLS_KEY_FILE"),
        ({"GRPC_TLS_CA_FILE": "{ca}"}, "GRPC_TLS_CERT_FILE"),
        ({"GRPC_TLS_CERT_FILE": "{ca}", "GRPC_TLS_KEY_FILE": "{ca}"}, "GRPC_TLS_CERT_FILE"),
    ],
)
def test_bad_tls_settings_stop_a_server_with_one_line(
    env: dict[str, str], variable: str, pki: Pki
) -> None:
    given = {k: v.format(cert=pki.server.cert, ca=pki.ca) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_TLS_")}
    result = subprocess.run(
        ["blockx-coordinator"],
        env={**clean, **given},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]


async def test_a_plaintext_client_to_a_tls_server_fails_clearly(
    tls_cluster: tuple[CoordinatorProcess, WorkerProcess, str], pki: Pki
) -> None:
    _, worker, _ = tls_cluster
    await wait_ready_over_tls(worker, client_tls(pki).ssl_context())
    channel = Channel("127.0.0.1", worker.port)
    try:
        # The server drops the connection at once: not a hang until the deadline.
        with pytest.raises(StreamTerminatedError, match="Connection lost"):
            await worker_v1.WorkerServiceStub(channel).get_task_result(
                worker_v1.GetTaskResultRequest(task_id="t"), timeout=10
            )
    finally:
        channel.close()
