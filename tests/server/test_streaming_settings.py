"""STREAM_BUILD_ENABLED and SCAN_SLOTS: each profile's default, overrides, and
values refused with one line naming the variable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blockx_server.pipeline.builders import StreamBuildConfig
from blockx_server.runtime.env import ConfigErrors
from blockx_server.runtime.settings import Setting
from blockx_server.worker.config import (
    BLOCK_WORKER,
    BUNDLE_WORKER,
    WorkerProfile,
    load_worker_config,
    worker_settings,
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"FUNCTIONS_DIR": str(tmp_path)}


@pytest.mark.parametrize(
    ("profile", "enabled"), [(BLOCK_WORKER, False), (BUNDLE_WORKER, True)], ids=["block", "bundle"]
)
def test_stream_build_is_off_on_the_block_worker_and_on_on_the_bundle_worker(
    profile: WorkerProfile, enabled: bool, env: dict[str, str]
) -> None:
    assert load_worker_config(profile, env).stream_build == StreamBuildConfig(
        enabled=enabled, scan_slots=8
    )
    settings: dict[str, Setting[Any]] = {s.name: s for s in worker_settings(profile)}
    assert settings["STREAM_BUILD_ENABLED"].default_text() == ("true" if enabled else "false")
    assert settings["SCAN_SLOTS"].default_text() == "8"


@pytest.mark.parametrize("profile", [BLOCK_WORKER, BUNDLE_WORKER], ids=["block", "bundle"])
def test_either_worker_can_be_told_otherwise(profile: WorkerProfile, env: dict[str, str]) -> None:
    for raw, enabled in (("true", True), ("off", False), ("1", True), ("no", False)):
        config = load_worker_config(
            profile, {**env, "STREAM_BUILD_ENABLED": raw, "SCAN_SLOTS": "3"}
        )
        assert config.stream_build == StreamBuildConfig(enabled=enabled, scan_slots=3)


def test_bad_values_are_refused_one_line_each(env: dict[str, str]) -> None:
    bad = {**env, "SCAN_SLOTS": "0", "STREAM_BUILD_ENABLED": "maybe"}
    with pytest.raises(ConfigErrors) as err:
        load_worker_config(BUNDLE_WORKER, bad)
    assert str(err.value).splitlines() == [
        "STREAM_BUILD_ENABLED must be true or false (got 'maybe')",
        "SCAN_SLOTS must be >= 1 (got 0)",
    ]
    with pytest.raises(ConfigErrors) as err:
        load_worker_config(BLOCK_WORKER, {**env, "SCAN_SLOTS": "many"})
    assert str(err.value).splitlines() == ["SCAN_SLOTS must be an integer (got 'many')"]
