"""``python -m blockx_executor``: the executor process's start-up (arguments, resource
limits, the Worker's socket, the sandbox), then ``Runner.serve`` until the Worker
closes the connection."""

from __future__ import annotations

import argparse
import gc
import resource
import socket
import sys

from blockx_executor.runner import Runner
from blockx_executor.sandbox import install_sandbox

GC_YOUNG_THRESHOLD = 10_000


def _apply_limits(memory_limit_bytes: int, max_open_files: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_limit_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    if max_open_files > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = max_open_files if hard == resource.RLIM_INFINITY else min(max_open_files, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m blockx_executor")
    parser.add_argument("--socket", required=True, help="the Worker's Unix socket")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=200)
    parser.add_argument("--memory-limit-bytes", type=int, default=0)
    parser.add_argument("--max-open-files", type=int, default=256)
    parser.add_argument(
        "--no-sandbox", action="store_true", help="allow network, processes and file writes"
    )
    args = parser.parse_args(argv)
    sys.dont_write_bytecode = True
    _apply_limits(args.memory_limit_bytes, args.max_open_files)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(args.socket)
    except OSError as exc:
        print(f"blockx_executor: cannot connect to {args.socket}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not args.no_sandbox:
        install_sandbox()
    # Batches of call arguments and results live through a frame: at the default
    # young threshold (700) the cyclic collector walked them several times per batch.
    # What start-up allocated is never garbage: frozen, no collection walks it.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    runner = Runner(sock, args.executor_id, args.heartbeat_interval_ms / 1000)
    try:
        runner.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the Worker went away
    finally:
        sock.close()
