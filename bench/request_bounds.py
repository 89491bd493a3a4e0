"""Request-bounds benchmark: what a 100 MB SubmitTask costs a Worker.

Run: uv run python bench/request_bounds.py [--mb 100] [--attacks 3] [--seconds 3]

Starts etcd and one ``blockx-worker`` (2 executors) from the interpreter's own
environment, so the same script measures another checkout when run with that
checkout's interpreter (``/path/to/checkout/.venv/bin/python bench/request_bounds.py``).
Then, with grpc.health.v1 Check probes running back to back on one channel:

* ``idle``: ``--seconds`` of probes only;
* ``attack``: ``--attacks`` SubmitTask requests of ``--mb`` MB each (a valid call
  config padded with one long JSON string), sent one after another from a separate
  process so that the probe loop's own latency is not the attacker's; probes run
  until the last one is answered.

Prints, per phase, probe latency p50/p99/max and the Worker's RSS (before, peak
while sampling every 20 ms, after), each attack's status and duration, and one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = Path(__file__).resolve().parents[1] / "examples" / "functions"
SERVICE = "worker.v1.WorkerService"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def percentiles(latencies_s: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_s)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "probes": len(ordered),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(0.02)


async def probe_until(port: int, done: asyncio.Event, latencies: list[float]) -> None:
    channel = Channel("127.0.0.1", port)
    try:
        stub = HealthStub(channel)
        while not done.is_set():
            start = time.perf_counter()
            await stub.Check(HealthCheckRequest(service=SERVICE), timeout=60)
            latencies.append(time.perf_counter() - start)
    finally:
        channel.close()


async def phase(port: int, pid: int, body: Any) -> dict[str, Any]:
    """Probes and RSS samples while ``body`` (a coroutine function) runs."""
    done = asyncio.Event()
    latencies: list[float] = []
    sampler = RssSampler(pid)
    before = rss_bytes(pid)
    sampling = asyncio.create_task(sampler.run())
    probing = asyncio.create_task(probe_until(port, done, latencies))
    try:
        extra = await body()
    finally:
        done.set()
        await probing
        sampling.cancel()
    return {
        **percentiles(latencies),
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(max(sampler.peak, before) / 2**20, 1),
        "rss_after_mb": round(rss_bytes(pid) / 2**20, 1),
        **extra,
    }


# --- the attacker: a separate process -----------------------------------------------


async def attack(port: int, megabytes: int, index: int) -> dict[str, Any]:
    pad = "x" * (megabytes * 2**20)
    config = json.dumps({"function": "hello_world", "callList": [], "pad": pad})
    request = worker_v1.SubmitTaskRequest(
        task=worker_v1.TaskInput(
            task_id=f"bench-huge-{index}-{os.getpid()}",
            function_call_config=worker_v1.FunctionCallConfig(
                type="CallListCallConfig", config=config
            ),
            result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
        )
    )
    channel = Channel("127.0.0.1", port)
    start = time.perf_counter()
    try:
        await worker_v1.WorkerServiceStub(channel).submit_task(request, timeout=300)
        status, message = "OK", ""
    except GRPCError as exc:
        status, message = exc.status.name, exc.message or ""
    except (OSError, TimeoutError) as exc:
        status, message = type(exc).__name__, str(exc)
    finally:
        channel.close()
    return {
        "status": status,
        "message": message[:160],
        "seconds": round(time.perf_counter() - start, 2),
    }


def run_attacker(port: int, megabytes: int, index: int) -> dict[str, Any]:
    result: dict[str, Any] = asyncio.run(attack(port, megabytes, index))
    return result


# --- main ---------------------------------------------------------------------------


async def wait_serving(port: int, proc: asyncio.subprocess.Process, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise SystemExit(f"blockx-worker exited; see {log}")
        channel = Channel("127.0.0.1", port)
        try:
            answer = await HealthStub(channel).Check(HealthCheckRequest(service=SERVICE), timeout=2)
            if answer.status == HealthCheckResponse.SERVING:
                return
        except (OSError, GRPCError, TimeoutError):
            pass
        finally:
            channel.close()
        await asyncio.sleep(0.1)
    raise SystemExit("blockx-worker did not become ready")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    worker_binary = Path(sys.executable).parent / "blockx-worker"
    tmp = Path(tempfile.mkdtemp(prefix="blockx-bench-bounds-"))
    async with EtcdServer() as etcd:
        port = free_port()
        log = tmp / "worker.log"
        with log.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                str(worker_binary),
                env={
                    **os.environ,
                    "ETCD_ENDPOINTS": etcd.endpoint,
                    "WORKER_LISTEN": f"127.0.0.1:{port}",
                    "FUNCTIONS_DIR": str(FUNCTIONS),
                    "EXECUTOR_COUNT": "2",
                },
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
            try:
                await wait_serving(port, proc, log)

                async def idle() -> dict[str, Any]:
                    await asyncio.sleep(args.seconds)
                    return {}

                async def attacks() -> dict[str, Any]:
                    results = []
                    for index in range(args.attacks):
                        results.append(
                            await asyncio.to_thread(_attacker_subprocess, port, args.mb, index)
                        )
                    return {"attacks": results}

                idle_phase = await phase(port, proc.pid, idle)
                attack_phase = await phase(port, proc.pid, attacks)
                alive = proc.returncode is None
            finally:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 30)
    return {
        "worker": str(worker_binary),
        "mb": args.mb,
        "idle": idle_phase,
        "attack": attack_phase,
        "worker_alive_after": alive,
    }


def _attacker_subprocess(port: int, megabytes: int, index: int) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--attack-port",
            str(port),
            "--mb",
            str(megabytes),
            "--attack-index",
            str(index),
        ],
        capture_output=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"worker: {result['worker']}")
    header = f"{'phase':8} {'probes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}"
    print(header + f" {'RSS before':>11} {'peak':>8} {'after':>8}  (MB)")
    for name in ("idle", "attack"):
        p = result[name]
        print(
            f"{name:8} {p['probes']:>7} {p['p50_ms']:>8} {p['p99_ms']:>8} {p['max_ms']:>9}"
            f" {p['rss_before_mb']:>11} {p['rss_peak_mb']:>8} {p['rss_after_mb']:>8}"
        )
    for attack_result in result["attack"]["attacks"]:
        print(
            f"  {result['mb']} MB SubmitTask: {attack_result['status']} in "
            f"{attack_result['seconds']} s {attack_result['message']}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--attacks", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--attack-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--attack-index", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.attack_port is not None:
        print(json.dumps(run_attacker(parsed.attack_port, parsed.mb, parsed.attack_index)))
    else:
        print_table(asyncio.run(main(parsed)))
