"""Console entry points: ``blockx-coordinator`` and ``blockx-bundle-coordinator``."""

from __future__ import annotations

import gc

from blockx_server.coordinator.app import serve
from blockx_server.coordinator.config import (
    BLOCK_PROFILE,
    BUNDLE_PROFILE,
    Profile,
    coordinator_settings,
    load_coordinator_config,
)
from blockx_server.runtime.event_loop import run_on
from blockx_server.runtime.process import cpu_profile, fail, start_program
from blockx_server.runtime.serving import ListenError

GC_YOUNG_THRESHOLD = 10_000


def run(profile: Profile) -> None:
    config = start_program(
        profile.program,
        f"The {profile.deployment} Coordinator: places tasks on the {profile.deployment} "
        "Workers registered in etcd.",
        coordinator_settings(profile),
        lambda environ: load_coordinator_config(profile, environ),
    )
    # Every ReserveWorkerSlot allocates a few hundred short-lived containers (HTTP/2
    # frames, headers, messages): at the default threshold (700) the cyclic collector
    # ran a full collection about twice a second under load, each walking everything
    # start-up allocated (20-25 ms stalls in bench/placement_bench.py). What start-up
    # allocated is never garbage: frozen, no collection walks it.
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
    with cpu_profile(config.cpu_profile_path):
        try:
            run_on(config.event_loop, serve(config))
        except ListenError as exc:
            fail(profile.program, str(exc))
        except OSError as exc:
            fail(profile.program, f"stopped: {exc}")
        except KeyboardInterrupt:
            pass


def main_block() -> None:
    run(BLOCK_PROFILE)


def main_bundle() -> None:
    run(BUNDLE_PROFILE)
