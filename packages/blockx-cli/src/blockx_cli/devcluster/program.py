"""``blockx-dev``: a local BlockX cluster in the foreground (``blockx dev up``).

It starts etcd and the Coordinator, a Worker, the Sync Invoker and the proxy, and
(unless ``--no-chain``) anvil, a block database, a sink database, the bundle
Coordinator and a bundle Worker, with test tokens, ``--blocks`` blocks of history,
a block mined every ``--block-time`` seconds and an ingest following the head
(``--no-feed``: an empty chain, for programs that drive it, such as ``blockx demo``)
(``launcher.DevCluster``), serving the functions of ``--functions``, FUNCTIONS_DIR
or ``--examples``/functions (``layout``), and the web dashboard (``blockx
dashboard``; ``--no-dashboard``: not), on free ports unless port options fix
them. It runs the smoke task ``examples/tasks/hello_world.json`` through the client
when it serves the example functions (unless ``--no-smoke``), prints how to reach
everything and the ``export`` lines a shell needs (``--ready-json``: one JSON line
instead, for programs such as ``blockx demo``), writes the addresses to
``~/.config/blockx/dev.toml`` for the CLI and SDK in any shell
(``blockx_client.dev_config``; ``--no-dev-config``: not; while another ``dev up``
writing that file runs, it is refused before it starts anything), streams the logs (or
writes them to ``--log-file``) until Ctrl-C or SIGTERM, and stops everything it
started and removes the file. ``--once`` stops right after the smoke task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import IO, Final, NoReturn, TypeVar

import msgspec

from blockx_cli.devcluster.chain import ChainOptions
from blockx_cli.devcluster.launcher import DevCluster, Endpoints, LaunchOptions
from blockx_cli.devcluster.layout import find_layout
from blockx_cli.devcluster.processes import LaunchError
from blockx_cli.devcluster.ready import CHAIN_READY, READY
from blockx_cli.devcluster.smoke import run_smoke_task
from blockx_cli.launch import collect_cycles
from blockx_client import BlockxError, TaskFileError
from blockx_client.dev_config import (
    DevUpRunning,
    claim_dev_config,
    dev_config_path,
    dev_lock_path,
    remove_dev_config,
    write_dev_config,
)
from blockx_server.runtime.process import stop_on_signals

PROGRAM: Final = "blockx-dev"
T = TypeVar("T")


def fail(message: str) -> NoReturn:
    """Each line of ``message`` on stderr and exit code 2; never a traceback."""
    for line in message.splitlines():
        print(f"{PROGRAM}: {line}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _progress(line: str) -> None:
    print(line, flush=True)


def _banner(cluster: DevCluster, e: Endpoints, config_file: Path | None) -> str:
    executors = f"{cluster.options.executors} executors"
    assert cluster.etcd is not None  # it is up
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
    ]
    if e.dashboard is not None:
        lines.append(f"  dashboard           {e.dashboard}  (read-only, blockx dashboard)")
    lines += [
        f"  metrics             {url}  ({process.replace('_', ' ')})"
        for process, url in e.metrics_by_process.items()
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
    lines += [
        "",
        "  for blockx and blockx_client in another shell (every RPC through the proxy;",
        "  `blockx --direct` or Client(direct=True) dial each address instead):",
    ]
    if config_file is not None:
        lines.append(f"    nothing to do: they read {config_file} while this runs; or")
    lines += [f"    export {name}={value}" for name, value in exports(e).items()]
    return "\n".join(lines) + "\n"


def exports(e: Endpoints) -> dict[str, str]:
    """The variables that point the CLI and the SDK at this cluster, its proxy and
    its chain (``blockx_client.dev_config.DEV_VARIABLES``)."""
    found = {
        "ETCD_ENDPOINTS": e.etcd,
        "BLOCKX_COORDINATOR": e.coordinator,
        "BLOCKX_BUNDLE_COORDINATOR": e.bundle_coordinator,
        "BLOCKX_SYNC_INVOKER": e.sync_invoker,
        "PROXY_SOCKET_PATH": e.proxy_socket,
        "CHAIN_RPC_URL": e.rpc_url,
        "BLOCKDB_URL": e.block_db_url,
        "SINK_DB_URL": e.sink_db_url,
    }
    return {name: value for name, value in found.items() if value}


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None when Ctrl-C or SIGTERM comes first (``work`` cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    # Whatever the start was doing when it was cancelled is cleaned up by stop().
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return None


async def run(
    options: LaunchOptions,
    log: IO[str],
    *,
    smoke: bool = True,
    ready_json: bool = False,
    once: bool = False,
    config_file: Path | None = None,
) -> None:
    """``config_file``: where to write the addresses (its lock held by the caller)."""
    stop = stop_on_signals()
    task_file = options.layout.smoke_task if smoke else None
    print("Starting the BlockX dev cluster", flush=True)
    cluster = DevCluster(options, log, _progress)
    if ready_json:
        cluster.on_chain_ready = lambda chain: print(CHAIN_READY + json.dumps(chain), flush=True)
    try:
        cluster.check()
    except LaunchError:
        await cluster.stop()  # nothing has started: this removes its directory
        raise
    try:
        endpoints = await _unless_stopped(cluster.start(), stop)
        if endpoints is None:
            return
        if config_file is not None:
            write_dev_config(exports(endpoints), config_file)
        if not ready_json:
            print(_banner(cluster, endpoints, config_file), flush=True)
        if task_file is not None:
            print(f"Smoke task: {task_file}", file=log, flush=True)
            answer = await _unless_stopped(run_smoke_task(endpoints.coordinator, task_file), stop)
            if answer is None:
                return
            print(answer + "\n", flush=True)
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
        if not stop.is_set():  # after Ctrl-C or SIGTERM an exit is no news
            for child in cluster.exited():
                print(f"{PROGRAM}: {child.name} exited with code {child.proc.returncode}")
    finally:
        if config_file is not None:
            remove_dev_config(config_file)
        await cluster.stop()
        print(f"{PROGRAM}: stopped", file=log, flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    version = importlib.metadata.version("blockx-cli")
    p.add_argument("--version", action="version", version=f"{PROGRAM} {version}")
    free = "[a free port]"
    p.add_argument("--coordinator-port", type=int, help=free)
    p.add_argument("--bundle-coordinator-port", type=int, help=free)
    p.add_argument("--worker-port", type=int, help=free)
    p.add_argument("--bundle-worker-port", type=int, help=free)
    p.add_argument("--sync-invoker-port", type=int, help=free)
    p.add_argument("--metrics-port", type=int, help=f"the coordinator's Prometheus port {free}")
    p.add_argument("--anvil-port", type=int, help=free)
    p.add_argument("--dashboard-port", type=int, help=f"the web dashboard's port {free}")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the web dashboard")
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
    p.add_argument(
        "--functions",
        type=Path,
        help="the function modules to serve [FUNCTIONS_DIR, else EXAMPLES/functions]",
    )
    p.add_argument(
        "--examples",
        type=Path,
        help="functions/, and if there memory_seed.json and tasks/hello_world.json [examples]",
    )
    p.add_argument("--once", action="store_true", help="stop after the smoke task")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke task")
    p.add_argument(
        "--ready-json",
        action="store_true",
        help="print one BLOCKX_DEV_READY {json} line (and BLOCKX_DEV_CHAIN {json} before it, "
        "once the chain is up)",
    )
    p.add_argument(
        "--no-dev-config",
        action="store_true",
        help=f"do not write the addresses to {dev_config_path()}",
    )
    p.add_argument("--log-file", help="write the processes' logs here, not to stdout")
    return p


def launch(
    options: LaunchOptions,
    *,
    smoke: bool = True,
    ready_json: bool = False,
    once: bool = False,
    dev_config: bool = True,
    log_file: str | None = None,
) -> None:
    """Run the cluster until Ctrl-C or SIGTERM (or the smoke task, with ``once``).

    With ``dev_config``, a second ``dev up`` (one holding the lock next to dev.toml)
    is refused before anything is started or written."""
    with contextlib.ExitStack() as held:
        config_file: Path | None = None
        if dev_config:
            try:
                config_file = held.enter_context(claim_dev_config())
            except DevUpRunning as exc:
                fail(str(exc))
            except OSError as exc:
                fail(f"cannot lock {dev_lock_path()}: {exc.strerror}")
        log: IO[str] = sys.stdout
        if log_file is not None:
            try:
                log = open(log_file, "a", buffering=1)  # noqa: SIM115 (closed at exit)
            except OSError as exc:
                fail(f"cannot write the log file {log_file}: {exc.strerror}")
        collect_cycles()
        try:
            asyncio.run(
                run(
                    options,
                    log,
                    smoke=smoke,
                    ready_json=ready_json,
                    once=once,
                    config_file=config_file,
                )
            )
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
    try:
        layout = find_layout(functions=args.functions, examples=args.examples)
    except LaunchError as exc:
        fail(str(exc))
    options = LaunchOptions(
        layout=layout,
        coordinator_port=args.coordinator_port,
        bundle_coordinator_port=args.bundle_coordinator_port,
        worker_port=args.worker_port,
        bundle_worker_port=args.bundle_worker_port,
        sync_invoker_port=args.sync_invoker_port,
        metrics_port=args.metrics_port,
        proxy_socket=Path(args.proxy_socket) if args.proxy_socket else None,
        executors=args.executors,
        dashboard=not args.no_dashboard,
        dashboard_port=args.dashboard_port,
        chain=None if args.no_chain else chain,
    )
    launch(
        options,
        smoke=not args.no_smoke,
        ready_json=args.ready_json,
        once=args.once,
        dev_config=not args.no_dev_config,
        log_file=args.log_file,
    )


if __name__ == "__main__":
    main()
