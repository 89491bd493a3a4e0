"""The configuration layer: every bad variable at once, sources, and help that matches."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from blockx_server.calls.config import CALL_SETTINGS, load_call_settings, read_call_settings
from blockx_server.coordinator.config import (
    BLOCK_PROFILE,
    BUNDLE_PROFILE,
    coordinator_settings,
    load_coordinator_config,
    read_coordinator_config,
)
from blockx_server.proxy import config as proxy_config
from blockx_server.runtime.env import ConfigError, ConfigErrors, ConfigReader, EnvironSource
from blockx_server.runtime.process import cpu_profile
from blockx_server.runtime.settings import Setting
from blockx_server.syncinvoker import config as syncinvoker_config
from blockx_server.worker.config import (
    BLOCK_WORKER,
    BUNDLE_WORKER,
    load_worker_config,
    read_worker_config,
    worker_settings,
)


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    d.mkdir()
    return d


def _errors(load: Callable[[], object]) -> list[str]:
    with pytest.raises(ConfigErrors) as err:
        load()
    lines = str(err.value).splitlines()
    assert lines == [str(e) for e in err.value.errors]
    return lines


def test_two_bad_variables_give_two_lines() -> None:
    env = {"COORDINATOR_LISTEN": "8080", "BLOCKX_LOG_LEVEL": "loud"}
    lines = _errors(lambda: load_coordinator_config(BLOCK_PROFILE, env))
    assert len(lines) == 2
    assert lines[0].startswith("COORDINATOR_LISTEN must be host:port or :port")
    assert lines[1] == ("BLOCKX_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR (got 'LOUD')")


def test_each_line_is_the_message_of_that_variable_alone(functions_dir: Path) -> None:
    bad = {"EXECUTOR_COUNT": "0", "EXECUTOR_SANDBOX": "maybe", "FUNCTIONS_DIR": "/nonexistent"}
    together = _errors(lambda: load_call_settings(bad))
    alone = []
    for variable, value in bad.items():
        env = {"FUNCTIONS_DIR": str(functions_dir), variable: value}
        alone += _errors(functools.partial(load_call_settings, env))
    assert together == alone


def test_a_config_errors_is_a_config_error_naming_the_first() -> None:
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(
            BLOCK_PROFILE, {"COORDINATOR_MAX_CANDIDATES": "0", "COORDINATOR_SLOT_TTL_MS": "0"}
        )
    assert isinstance(err.value, ConfigErrors)
    assert err.value.variable == "COORDINATOR_SLOT_TTL_MS"
    assert [e.variable for e in err.value.errors] == [
        "COORDINATOR_SLOT_TTL_MS",
        "COORDINATOR_MAX_CANDIDATES",
    ]


def test_every_rule_of_a_core_validate_is_reported() -> None:
    env = {
        "TASK_SLOTS": "0",
        "RESULT_RETENTION_MS": "0",
        "WATCH_DISCONNECT_GRACE_MS": "-1",
        "FUNCTIONS_DIR": "/nonexistent",
        "WORKER_LISTEN": "127.0.0.1:9090",
    }
    lines = _errors(lambda: load_worker_config(BLOCK_WORKER, env))
    assert [line.split()[0] for line in lines] == [
        "TASK_SLOTS",
        "RESULT_RETENTION_MS",
        "WATCH_DISCONNECT_GRACE_MS",
        "FUNCTIONS_DIR",
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1", "FAILED_TASKS_KEPT must be >= 0 (got -1)"),
        ("lots", "FAILED_TASKS_KEPT must be an integer (got 'lots')"),
        ("1000001", "FAILED_TASKS_KEPT must be 0 to 1000000 (got 1000001)"),
    ],
)
def test_failed_tasks_kept_is_refused_when_bad(functions_dir: Path, value: str, says: str) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), "FAILED_TASKS_KEPT": value}
    assert _errors(lambda: load_worker_config(BLOCK_WORKER, env)) == [says]


def test_failed_tasks_kept_zero_keeps_none(functions_dir: Path) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), "FAILED_TASKS_KEPT": "0"}
    assert load_worker_config(BLOCK_WORKER, env).core.failed_tasks_kept == 0


@pytest.mark.parametrize("program", ["worker", "coordinator"])
def test_a_cpu_profile_path_must_be_writable_at_start_up(
    program: str, functions_dir: Path, tmp_path: Path
) -> None:
    variable = f"{program.upper()}_CPU_PROFILE"

    def load(value: str) -> Any:
        env = {"FUNCTIONS_DIR": str(functions_dir), variable: value}
        if program == "worker":
            return load_worker_config(BLOCK_WORKER, env)
        return load_coordinator_config(BLOCK_PROFILE, env)

    missing = tmp_path / "no-such-directory" / "cpu.prof"
    assert _errors(lambda: load(str(missing))) == [
        f"{variable} must be a file in an existing directory (no directory {str(missing.parent)!r})"
    ]
    assert _errors(lambda: load(str(tmp_path))) == [
        f"{variable} must name a file, not a directory (got {str(tmp_path)!r})"
    ]
    assert load(str(tmp_path / "cpu.prof")).cpu_profile_path == str(tmp_path / "cpu.prof")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"WORKER_LISTEN": "127.0.0.1:0"},
            "WORKER_LISTEN has port 0, which the Worker could not advertise: give a port, "
            "or set WORKER_ADVERTISE_ADDR to the address it is reached at",
        ),
        (
            {"WORKER_ADVERTISE_ADDR": "10.0.0.5:0"},
            "WORKER_ADVERTISE_ADDR has port 0, which no one can dial (got '10.0.0.5:0')",
        ),
    ],
)
def test_a_port_the_worker_cannot_advertise_is_refused(
    functions_dir: Path, env: dict[str, str], says: str
) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), **env}
    assert _errors(lambda: load_worker_config(BLOCK_WORKER, env)) == [says]


def test_an_executor_count_past_the_bound_starts_no_process(functions_dir: Path) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), "EXECUTOR_COUNT": "1000000"}
    assert _errors(lambda: load_call_settings(env)) == [
        "EXECUTOR_COUNT must be <= 1024 (got 1000000)"
    ]
    assert load_call_settings({**env, "EXECUTOR_COUNT": "1024"}).engine.pool.count == 1024


CASCADES = [
    # (environment, the one variable reported): a rule over a bad value is not repeated.
    (
        {"COORDINATOR_HEARTBEAT_TIMEOUT_MS": "soon", "COORDINATOR_WATCH_GRACE_PERIOD_MS": "20000"},
        "COORDINATOR_HEARTBEAT_TIMEOUT_MS",
    ),
    (
        {"COORDINATOR_HEARTBEAT_TIMEOUT_MS": "0", "COORDINATOR_WATCH_GRACE_PERIOD_MS": "20000"},
        "COORDINATOR_HEARTBEAT_TIMEOUT_MS",
    ),
    ({"COORDINATOR_REGISTRY_PREFIXES": "/blockx/workers"}, "COORDINATOR_REGISTRY_PREFIXES"),
    ({"ETCD_ENDPOINTS": "a:1,,b:2"}, "ETCD_ENDPOINTS"),
]


@pytest.mark.parametrize(("env", "variable"), CASCADES)
def test_one_mistake_is_reported_once(env: dict[str, str], variable: str) -> None:
    lines = _errors(lambda: load_coordinator_config(BLOCK_PROFILE, env))
    assert [line.split()[0] for line in lines] == [variable]


@pytest.mark.parametrize(
    "env",
    [
        {"CALL_RETRY_BACKOFF_MS": "-1", "CALL_RETRY_BACKOFF_MAX_MS": "50"},
        {"EXECUTOR_HEARTBEAT_INTERVAL_MS": "x", "EXECUTOR_HEARTBEAT_TIMEOUT_MS": "100"},
    ],
)
def test_a_cross_variable_rule_waits_for_good_values(
    functions_dir: Path, env: dict[str, str]
) -> None:
    lines = _errors(lambda: load_call_settings({"FUNCTIONS_DIR": str(functions_dir), **env}))
    assert len(lines) == 1


def test_a_worker_prefix_of_the_wrong_kind_is_not_also_an_etcd_error() -> None:
    env = {"WORKER_REGISTRY_PREFIX": "not-a-prefix", "FUNCTIONS_DIR": "/nonexistent"}
    lines = _errors(lambda: load_worker_config(BLOCK_WORKER, env))
    assert [line.split()[0] for line in lines] == ["WORKER_REGISTRY_PREFIX", "FUNCTIONS_DIR"]


class TableSource:
    """A source other than the environment, as a TOML table would be: typed values."""

    def __init__(self, table: Mapping[str, object]) -> None:
        self._table = table

    def lookup(self, name: str) -> str | None:
        value = self._table.get(name)
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return ",".join(str(item) for item in value)
        return str(value)


def test_another_source_feeds_the_same_settings() -> None:
    reader = ConfigReader(
        TableSource(
            {
                "COORDINATOR_MAX_CANDIDATES": 5,
                "ETCD_ENDPOINTS": ["10.0.0.1:2379", "10.0.0.2:2379"],
                "COORDINATOR_CPU_RED_LINE": 0.5,
            }
        )
    )
    config = read_coordinator_config(BLOCK_PROFILE, reader)
    reader.finish()
    assert config.core.max_candidates == 5
    assert config.core.cpu_red_line == 0.5
    assert config.watcher.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")


def _names(settings: tuple[Setting[Any], ...]) -> list[str]:
    return [s.name for s in settings]


def _read_names(read: Callable[[ConfigReader], object], env: Mapping[str, str]) -> list[str]:
    reader = ConfigReader(EnvironSource(env))
    read(reader)
    return reader.names_read


def test_help_lists_exactly_what_each_program_reads(tmp_path: Path) -> None:
    # An advertise address is set so that the Worker reads it (unset, it is derived).
    worker_env = {"WORKER_ADVERTISE_ADDR": "10.0.0.1:9090"}
    programs: list[tuple[tuple[Setting[Any], ...], Callable[[ConfigReader], object]]] = [
        (CALL_SETTINGS, read_call_settings),
        (coordinator_settings(BLOCK_PROFILE), lambda r: read_coordinator_config(BLOCK_PROFILE, r)),
        (
            coordinator_settings(BUNDLE_PROFILE),
            lambda r: read_coordinator_config(BUNDLE_PROFILE, r),
        ),
        (worker_settings(BLOCK_WORKER), lambda r: read_worker_config(BLOCK_WORKER, r)),
        (worker_settings(BUNDLE_WORKER), lambda r: read_worker_config(BUNDLE_WORKER, r)),
        (syncinvoker_config.SETTINGS, syncinvoker_config.read_syncinvoker_config),
        (proxy_config.SETTINGS, proxy_config.read_proxy_config),
    ]
    for settings, read in programs:
        declared = _names(settings)
        assert len(set(declared)) == len(declared), declared
        assert sorted(_read_names(read, worker_env)) == sorted(declared)


def test_help_shows_each_profiles_own_defaults() -> None:
    def default(settings: tuple[Setting[Any], ...], name: str) -> str:
        return next(s for s in settings if s.name == name).default_text()

    assert default(coordinator_settings(BLOCK_PROFILE), "COORDINATOR_REGISTRY_PREFIXES") == (
        "/blockx/workers/"
    )
    assert default(coordinator_settings(BUNDLE_PROFILE), "COORDINATOR_REGISTRY_PREFIXES") == (
        "/blockx/bundle-workers/,/blockx/prod/lanes/default/bundle-workers/"
    )
    assert default(worker_settings(BUNDLE_WORKER), "WORKER_REGISTRY_PREFIX") == (
        "/blockx/bundle-workers/"
    )


def test_a_cpu_profile_that_cannot_be_written_at_exit_is_one_logged_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    path = folder / "cpu.prof"
    caplog.set_level(logging.INFO, logger="blockx_server.runtime.process")
    with cpu_profile(str(path)):
        folder.rmdir()  # gone while the process ran
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert caplog.records[0].getMessage().startswith(f"CPU profile not written to {path}: ")
    folder.mkdir()
    caplog.clear()
    with cpu_profile(str(path)):
        sum(range(1000))
    assert path.stat().st_size > 0
    assert [r.getMessage() for r in caplog.records] == [f"CPU profile written to {path}"]
