"""``python -m blockx_executor``: the executor process's start-up (arguments, the
Worker's socket, the OS confinement, the sandbox), then ``Runner.serve`` until the
Worker closes the connection.

``--probe`` only tries the confinement (namespaces and the user change) and prints
what failed as one JSON object: the Worker runs it once to choose what its
executors can do here."""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import tempfile

from blockx_executor import capture, confine
from blockx_executor.capture import CallOutputs
from blockx_executor.confine import ConfinementError
from blockx_executor.integrity import ExecutorCodeChanged, IntegrityCheck
from blockx_executor.runner import Runner
from blockx_executor.sandbox import CODE_WRITES, install_sandbox

GC_YOUNG_THRESHOLD = 10_000
# The exit code of an executor whose own code a call changed.
EXIT_CODE_CHANGED = 3


def _user(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m blockx_executor")
    parser.add_argument("--socket", required=True, help="the Worker's Unix socket")
    parser.add_argument("--executor-id", required=True)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=200)
    parser.add_argument(
        "--max-log-bytes", type=int, default=64 * 1024, help="what one call may print"
    )
    parser.add_argument("--memory-limit-bytes", type=int, default=0)
    parser.add_argument("--max-open-files", type=int, default=256)
    parser.add_argument("--max-file-bytes", type=int, default=0, help="RLIMIT_FSIZE, 0 = none")
    parser.add_argument("--max-processes", type=int, default=0, help="RLIMIT_NPROC, 0 = none")
    parser.add_argument("--run-as", type=_user, help="UID:GID to switch to after connecting")
    parser.add_argument("--namespaces", action="store_true", help="own network and mount ns")
    parser.add_argument("--parent-pid", type=int, help="the Worker: die with it")
    parser.add_argument("--tmp-dir", help="this executor's private temporary directory")
    parser.add_argument("--probe", action="store_true", help="try the confinement, report, exit")
    parser.add_argument(
        "--no-sandbox", action="store_true", help="allow network, processes and file writes"
    )
    return parser


def _probe(args: argparse.Namespace) -> dict[str, str | None]:
    report: dict[str, str | None] = {"namespaces": None, "user": None}
    paths = confine.import_paths()
    if args.namespaces:
        try:
            confine.enter_namespaces(run_as_other_user=args.run_as is not None)
        except (ConfinementError, OSError) as exc:
            report["namespaces"] = str(exc)
    if args.run_as is not None:
        try:
            confine.become(*args.run_as)
            missing = confine.unreadable(paths)
            if missing:
                report["user"] = f"uid {args.run_as[0]} cannot read {', '.join(missing)}"
        except ConfinementError as exc:
            report["user"] = str(exc)
    return report


def _confine(args: argparse.Namespace) -> None:
    paths = confine.import_paths()
    if args.namespaces:
        try:
            confine.enter_namespaces(run_as_other_user=args.run_as is not None)
        except OSError as exc:
            raise ConfinementError(f"entering namespaces: {exc}") from None
    if args.run_as is not None:
        confine.become(*args.run_as)
        missing = confine.unreadable(paths)
        if missing:
            raise ConfinementError(f"uid {args.run_as[0]} cannot read {', '.join(missing)}")
    if args.parent_pid is not None:
        confine.die_with_parent(args.parent_pid)
    if args.tmp_dir is not None:
        os.chdir(args.tmp_dir)
        tempfile.tempdir = args.tmp_dir
    confine.apply_limits(
        memory_bytes=args.memory_limit_bytes,
        open_files=args.max_open_files,
        file_bytes=args.max_file_bytes,
        processes=args.max_processes,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    sys.dont_write_bytecode = True
    if args.probe:
        print(json.dumps(_probe(args)), flush=True)
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(args.socket)
    except OSError as exc:
        print(f"blockx_executor: cannot connect to {args.socket}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        _confine(args)
    except ConfinementError as exc:
        print(f"blockx_executor: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    outputs = CallOutputs(args.max_log_bytes)
    capture.install(outputs)
    if not args.no_sandbox:
        install_sandbox()
    runner = Runner(sock, args.executor_id, args.heartbeat_interval_ms / 1000, outputs)
    # Taken after start-up, before any user code: what the executor's code must stay.
    runner.integrity = IntegrityCheck.of(runner, None if args.no_sandbox else CODE_WRITES)
    # Batches of call arguments and results live through a frame: at the default
    # young threshold (700) the cyclic collector walked them several times per batch.
    # What start-up allocated is never garbage: frozen, no collection walks it.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    try:
        runner.serve()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the Worker went away
    except ExecutorCodeChanged as exc:
        print(f"blockx_executor: {exc}; exiting", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE_CHANGED) from None
    finally:
        sock.close()
