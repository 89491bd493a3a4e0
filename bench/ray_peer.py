"""Ray's trivial tasks, the peer of ``task_latency_bench.py``; run by that bench with
the interpreter of a venv that has ``ray`` (not a project dependency):

    python3 -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install ray
    /tmp/ray-venv/bin/python bench/ray_peer.py --serial 400 --clients 64 --seconds 8

A local Ray (``ray.init`` with ``--cpus`` CPUs, as many workers as the BlockX
Worker has executors) runs ``double(1)``: one at a time for p50/p99, then from
``--clients`` asyncio callers that each await one task at a time, for tasks/s:
the same closed loop as the BlockX side. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from closed_loop import measure  # bench/ is the script's directory, first on sys.path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serial", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    # Started under ``uv run`` (the bench is), Ray would start its workers with
    # ``uv run`` in the project, whose environment has no ray.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    import ray  # type: ignore[import-not-found]  # the peer's venv, not the project's

    started = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    init_s = time.perf_counter() - started

    def double_body(x: int) -> int:
        return x * 2

    double = ray.remote(double_body)

    async def task(i: int) -> object:
        if await double.remote(1) != 2:
            raise RuntimeError(f"ray task {i} answered wrong")
        return None

    async def run() -> dict[str, object]:
        await measure(task, 8, count=500)  # warm: workers started, functions shipped
        serial = await measure(task, 1, count=args.serial)
        concurrent = await measure(task, args.clients, seconds=args.seconds)
        return {"ray_serial": serial, "ray_concurrent": concurrent}

    out = {"ray_version": ray.__version__, "ray_init_s": round(init_s, 2), **asyncio.run(run())}
    print(json.dumps(out), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
