"""``blockx-dev``: a local BlockX cluster in the foreground (``blockx dev up``).

It starts etcd and the Coordinator, a Worker, the Sync Invoker and the proxy, and
(unless ``--no-chain``) anvil, a block database, a sink database, the bundle
Coordinator and a bundle Worker, with test tokens, ``--blocks`` blocks of history,
a block mined every ``--block-time`` seconds and an ingest following the head
(``--no-feed``: an empty chain, for programs that drive it, such as ``blockx demo``)
(``launcher.DevCluster``), then runs the smoke task ``examples/tasks/hello_world.json``
through the client unless ``--no-smoke``, prints how to reach everything
(``--ready-json``: one JSON line, for programs such as ``blockx demo``), streams the
logs (or writes them to ``--log-file``) until Ctrl-C or SIGTERM, and stops everything
it started. ``--once`` stops right after the smoke task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import IO, Final, NoReturn

import msgspec

from blockx_cli.devcluster.chain import ChainOptions
from blockx_cli.devcluster.launcher import DevCluster, Endpoints, LaunchOptions
from blockx_cli.devcluster.processes import LaunchError
from blockx_cli.devcluster.smoke import run_smoke_task
from blockx_client import BlockxError, TaskFileError
from blockx_server.runtime.process import stop_on_signals

PROGRAM: Final = "blockx-dev"
READY: Final = "BLOCKX_DEV_READY "
SMOKE_TASK: Final = Path("tasks") / "hello_world.json"


def fail(message: str) -> NoReturn:
    """One line on stderr and exit code 2; never a traceback."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _banner(cluster: DevCluster, e: Endpoints) -> str:
    executors = f"{cluster.options.executors} executors"
    lines = [
        "",
        "BlockX dev cluster is up",
        f"  etcd                {e.etcd}  (data in {cluster.etcd.data_dir})",
        f"  coordinator         {e.coordinator}  coordinator.v1.CoordinatorService",
        f"  worker              {e.worker}  worker.v1.WorkerService (block), {executors}, "
        f"functions from {cluster.functions_dir}",
    ]
    if e.bundle_coordinator is not None:
        lines += [
            f"  bundle coordinator  {e.bundle_coordinator}  "
            "bundlecoordinator.v1.BundleCoordinatorService",
            f"  bundle worker       {e.bundle_worker}  worker.v1.WorkerService (bundle), "
            f"{executors}",
        ]
    lines += [
        f"  sync invoker        {e.sync_invoker}  syncinvoker.v1.SyncInvokerService",
        f"  proxy               unix:{e.proxy_socket}  (PROXY_SOCKET_PATH)",
        f"  metrics             {e.metrics}",
    ]
    chain = cluster.chain
    if chain is not None:
        lines += [
            f"  chain (anvil)       {e.rpc_url}  (CHAIN_RPC_URL)",
            f"  block database      {e.block_db_url}  (BLOCKDB_URL)",
            f"  sink database       {e.sink_db_url}  (SINK_DB_URL)",
        ]
        if chain.options.feed:
            every = chain.options.block_time_s
            mining = f"a block every {every:g} s" if every > 0 else "no live mining"
            lines.append(
                f"  feed                {len(chain.tokens)} test tokens, "
                f"{chain.options.history_blocks} blocks of history, {mining}, "
                "ingest following the head"
            )
            lines += [f"    token           {token}" for token in chain.tokens]
    exports = [f"BLOCKX_COORDINATOR={e.coordinator}", f"BLOCKX_SYNC_INVOKER={e.sync_invoker}"]
    if e.bundle_coordinator is not None:
        exports.append(f"BLOCKX_BUNDLE_COORDINATOR={e.bundle_coordinator}")
    lines += ["", "  for blockx and blockx_client:", f"    export {' '.join(exports)}"]
    return "\n".join(lines) + "\n"


async def run(
    options: LaunchOptions,
    log: IO[str],
    *,
    smoke: bool = True,
    ready_json: bool = False,
    once: bool = False,
) -> None:
    stop = stop_on_signals()
    examples = options.examples.resolve()
    task_file = examples / SMOKE_TASK
    if not (examples / "functions").is_dir() or not task_file.is_file():
        fail(
            f"{options.examples} has no functions/ and {SMOKE_TASK}; "
            "run from the repository root or pass --examples"
        )
    cluster = DevCluster(options, log)
    try:
        endpoints = await cluster.start()
        if not ready_json:
            print(_banner(cluster, endpoints), flush=True)
        if smoke:
            print(f"Smoke task: {task_file}", file=log, flush=True)
            print(await run_smoke_task(endpoints.coordinator, task_file) + "\n", flush=True)
        if ready_json:
            print(READY + json.dumps(msgspec.structs.asdict(endpoints)), flush=True)
        if once:
            return
        if not ready_json:
            print("Press Ctrl-C to stop.", flush=True)
        waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
        waiters += [asyncio.create_task(c.proc.wait()) for c in cluster.children]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        for child in cluster.exited():
            print(f"{PROGRAM}: {child.name} exited with code {child.proc.returncode}")
    finally:
        await cluster.stop()
        print(f"{PROGRAM}: stopped", file=log, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator-port", type=int, default=8080)
    p.add_argument("--bundle-coordinator-port", type=int, default=8081)
    p.add_argument("--worker-port", type=int, default=9090)
    p.add_argument("--bundle-worker-port", type=int, default=9092)
    p.add_argument("--sync-invoker-port", type=int, default=9091)
    p.add_argument("--metrics-port", type=int, default=9100)
    p.add_argument("--anvil-port", type=int, default=8545)
    p.add_argument("--no-chain", action="store_true", help="no anvil, databases nor bundle cluster")
    p.add_argument(
        "--no-feed", action="store_true", help="leave the chain empty, with no ingest running"
    )
    p.add_argument("--blocks", type=int, default=200, help="blocks of history to mine")
    p.add_argument(
        "--block-time", type=float, default=2.0, help="seconds between live blocks; 0: none"
    )
    p.add_argument("--proxy-socket", help="the proxy's Unix socket [a temporary path]")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--examples", type=Path, default=Path("examples"))
    p.add_argument("--once", action="store_true", help="stop after the smoke task")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke task")
    p.add_argument(
        "--ready-json", action="store_true", help="print one BLOCKX_DEV_READY {json} line"
    )
    p.add_argument("--log-file", help="write the processes' logs here, not to stdout")
    return p


def launch(
    options: LaunchOptions,
    *,
    smoke: bool = True,
    ready_json: bool = False,
    once: bool = False,
    log_file: str | None = None,
) -> None:
    """Run the cluster until Ctrl-C or SIGTERM (or the smoke task, with ``once``)."""
    log: IO[str] = sys.stdout
    if log_file is not None:
        try:
            log = open(log_file, "a", buffering=1)  # noqa: SIM115 (closed at exit)
        except OSError as exc:
            fail(f"cannot write the log file {log_file}: {exc.strerror}")
    try:
        asyncio.run(run(options, log, smoke=smoke, ready_json=ready_json, once=once))
    except (LaunchError, TaskFileError) as exc:
        fail(str(exc))
    except BlockxError as exc:
        fail(f"the smoke task: {exc.message}")
    except KeyboardInterrupt:
        pass
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    chain = ChainOptions(
        anvil_port=args.anvil_port or None,
        feed=not args.no_feed,
        history_blocks=max(args.blocks, 0),
        block_time_s=max(args.block_time, 0.0),
    )
    options = LaunchOptions(
        coordinator_port=args.coordinator_port,
        bundle_coordinator_port=args.bundle_coordinator_port,
        worker_port=args.worker_port,
        bundle_worker_port=args.bundle_worker_port,
        sync_invoker_port=args.sync_invoker_port,
        metrics_port=args.metrics_port,
        proxy_socket=Path(args.proxy_socket) if args.proxy_socket else None,
        executors=args.executors,
        examples=args.examples,
        chain=None if args.no_chain else chain,
    )
    launch(
        options,
        smoke=not args.no_smoke,
        ready_json=args.ready_json,
        once=args.once,
        log_file=args.log_file,
    )


if __name__ == "__main__":
    main()
