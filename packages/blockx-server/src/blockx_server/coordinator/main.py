"""Console entry points: ``blockx-coordinator`` and ``blockx-bundle-coordinator``."""

from __future__ import annotations

import asyncio
import os

from blockx_server.coordinator.app import serve
from blockx_server.coordinator.config import (
    BLOCK_PROFILE,
    BUNDLE_PROFILE,
    Profile,
    load_coordinator_config,
)
from blockx_server.runtime.env import ConfigError
from blockx_server.runtime.process import configure_logging, cpu_profile, fail


def run(profile: Profile) -> None:
    # Validate everything before anything is logged.
    try:
        config = load_coordinator_config(profile, os.environ)
    except ConfigError as exc:
        fail(profile.program, f"invalid configuration: {exc}")
    configure_logging(config.log_level)
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
