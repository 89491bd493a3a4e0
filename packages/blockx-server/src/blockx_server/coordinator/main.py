"""Console entry points: ``blockx-coordinator`` and ``blockx-bundle-coordinator``."""

from __future__ import annotations

import asyncio

from blockx_server.coordinator.app import serve
from blockx_server.coordinator.config import (
    BLOCK_PROFILE,
    BUNDLE_PROFILE,
    Profile,
    coordinator_settings,
    load_coordinator_config,
)
from blockx_server.runtime.process import cpu_profile, fail, start_program


def run(profile: Profile) -> None:
    config = start_program(
        profile.program,
        f"The {profile.deployment} Coordinator: places tasks on the {profile.deployment} "
        "Workers registered in etcd.",
        coordinator_settings(profile),
        lambda environ: load_coordinator_config(profile, environ),
    )
    with cpu_profile(config.cpu_profile_path):
        try:
            asyncio.run(serve(config))
        except OSError as exc:
            fail(
                profile.program, f"cannot serve on {config.listen_host}:{config.listen_port}: {exc}"
            )
        except KeyboardInterrupt:
            pass


def main_block() -> None:
    run(BLOCK_PROFILE)


def main_bundle() -> None:
    run(BUNDLE_PROFILE)
