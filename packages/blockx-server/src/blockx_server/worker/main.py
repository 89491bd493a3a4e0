"""Console entry points: ``blockx-worker`` (block) and ``blockx-bundle-worker`` (bundle)."""

from __future__ import annotations

import gc

from blockx_server.calls.functions import FunctionStoreError
from blockx_server.io.chain_config import CHAINS_TABLE
from blockx_server.runtime.event_loop import run_on
from blockx_server.runtime.process import StartupError, cpu_profile, fail, start_program
from blockx_server.runtime.serving import ListenError
from blockx_server.worker.app import serve
from blockx_server.worker.config import (
    BLOCK_WORKER,
    BUNDLE_WORKER,
    WorkerProfile,
    load_worker_config,
    worker_settings,
)

GC_YOUNG_THRESHOLD = 10_000


def run(profile: WorkerProfile) -> None:
    config = start_program(
        profile.program,
        f"A {profile.deployment} Worker: runs tasks in the slots it registers in etcd.",
        worker_settings(profile),
        lambda environ: load_worker_config(profile, environ),
        tables=(CHAINS_TABLE,),
    )
    # A Worker moves rows in bulk (scanned rows, call arguments, outputs) that live
    # through a task: at the default threshold (700) the cyclic collector walked them
    # again and again, a fifth of the Worker's CPU in bench/backfill_bench.py. What
    # start-up allocated (modules, configuration) is never garbage: frozen, no
    # collection walks it.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    try:
        with cpu_profile(config.cpu_profile_path):
            run_on(config.event_loop, serve(config))
    except FunctionStoreError as exc:
        fail(profile.program, f"cannot load functions: {exc}")
    except ListenError as exc:
        fail(profile.program, str(exc))
    except StartupError as exc:
        fail(profile.program, f"cannot start: {exc}")
    except OSError as exc:
        fail(profile.program, f"stopped: {exc}")
    except KeyboardInterrupt:
        pass


def main_block() -> None:
    run(BLOCK_WORKER)


def main_bundle() -> None:
    run(BUNDLE_WORKER)
