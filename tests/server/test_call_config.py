"""Calls-phase configuration from the environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blockx_core.failures import CallFailureKind
from blockx_server.calls.config import load_call_settings
from blockx_server.runtime.cpus import usable_cpus
from blockx_server.runtime.env import ConfigError


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    d = tmp_path / "functions"
    d.mkdir()
    return d


def test_defaults(functions_dir: Path) -> None:
    s = load_call_settings({"FUNCTIONS_DIR": str(functions_dir)})
    d, p = s.engine.dispatch, s.engine.pool
    assert (p.count, d.call_deadline_ms, d.task_max_inflight_calls) == (8, 5000, 1024)
    assert d.max_collected_output_bytes == 64 * 1024 * 1024
    assert d.initial_window == 64
    assert d.retry.max_attempts == 3
    assert (d.retry.backoff_ms, d.retry.backoff_max_ms) == (100, 2000)
    assert d.retry.retry_on == frozenset({CallFailureKind.EXECUTOR_LOST})
    assert (p.heartbeat_interval_ms, d.executor_heartbeat_timeout_ms) == (200, 3000)
    # RLIMIT_AS is on by default (4 GiB): a call cannot take the host's memory.
    assert (p.memory_limit_bytes, p.max_open_files, p.sandbox) == (4 << 30, 256, True)
    assert (p.isolation.user, p.isolation.max_file_bytes) == ("nobody", 1 << 30)
    assert p.max_log_bytes == 64 * 1024
    assert s.functions_dir == functions_dir
    assert s.functions_poll_interval_ms == 1000
    assert s.memory_seed_file is None
    assert s.record_max_bytes == 4 * 1024 * 1024
    # A CPU-bound task's calls spread over as many executors as there are CPUs.
    assert d.cpu_lanes == usable_cpus()


def test_every_variable(functions_dir: Path, tmp_path: Path) -> None:
    seed = tmp_path / "seed.json"
    seed.write_text('{"k": 1}')
    s = load_call_settings(
        {
            "FUNCTIONS_DIR": str(functions_dir),
            "EXECUTOR_COUNT": "2",
            "EXECUTOR_CPUS": "0",
            "CALL_DEADLINE_MS": "900",
            "TASK_MAX_INFLIGHT_CALLS": "10",
            "TASK_INITIAL_INFLIGHT_CALLS": "2",
            "MAX_COLLECTED_OUTPUT_BYTES": "100",
            "CALL_RETRY_MAX_ATTEMPTS": "5",
            "CALL_RETRY_BACKOFF_MS": "7",
            "CALL_RETRY_BACKOFF_MAX_MS": "70",
            "CALL_RETRY_ON": "executor_lost, IO_ERROR",
            "EXECUTOR_HEARTBEAT_INTERVAL_MS": "50",
            "EXECUTOR_HEARTBEAT_TIMEOUT_MS": "500",
            "EXECUTOR_MEMORY_LIMIT_BYTES": "1000000000",
            "EXECUTOR_MAX_OPEN_FILES": "64",
            "EXECUTOR_SANDBOX": "false",
            "EXECUTOR_USER": "-",
            "EXECUTOR_MAX_FILE_BYTES": "4096",
            "CALL_MAX_LOG_BYTES": "0",
            "CALL_RECORD_MAX_BYTES": "0",
            "EXECUTOR_RUNTIME_DIR": "/srv/blockx/runtime",
            "FUNCTIONS_POLL_INTERVAL_MS": "250",
            "IO_MEMORY_SEED_FILE": str(seed),
        }
    )
    d, p = s.engine.dispatch, s.engine.pool
    assert (p.count, d.call_deadline_ms, d.task_max_inflight_calls, d.initial_window) == (
        2,
        900,
        10,
        2,
    )
    assert d.max_collected_output_bytes == 100
    assert (d.retry.max_attempts, d.retry.backoff_ms, d.retry.backoff_max_ms) == (5, 7, 70)
    assert d.retry.retry_on == {CallFailureKind.EXECUTOR_LOST, CallFailureKind.IO_ERROR}
    assert (p.heartbeat_interval_ms, d.executor_heartbeat_timeout_ms) == (50, 500)
    assert (p.memory_limit_bytes, p.max_open_files, p.sandbox) == (1_000_000_000, 64, False)
    assert (p.isolation.user, p.isolation.max_file_bytes) == ("", 4096)
    assert p.max_log_bytes == 0
    assert p.isolation.runtime_dir == "/srv/blockx/runtime"
    assert s.functions_poll_interval_ms == 250
    assert s.memory_seed_file == seed
    assert s.record_max_bytes == 0
    assert d.cpu_lanes == 0


BAD = [
    ("EXECUTOR_COUNT", "0", ">= 1"),
    ("EXECUTOR_COUNT", "many", "integer"),
    ("EXECUTOR_CPUS", "-1", ">= 0"),
    ("EXECUTOR_CPUS", "all", "integer"),
    ("CALL_DEADLINE_MS", "0", ">= 1"),
    ("TASK_MAX_INFLIGHT_CALLS", "-1", ">= 1"),
    ("MAX_COLLECTED_OUTPUT_BYTES", "0", ">= 1"),
    ("CALL_RETRY_MAX_ATTEMPTS", "0", ">= 1"),
    ("CALL_RETRY_BACKOFF_MS", "-1", ">= 0"),
    ("CALL_RETRY_BACKOFF_MAX_MS", "50", ">= CALL_RETRY_BACKOFF_MS"),
    ("CALL_RETRY_ON", "EXECUTOR_LOST,NETWORK", "'NETWORK', not one of"),
    ("EXECUTOR_HEARTBEAT_TIMEOUT_MS", "200", "> EXECUTOR_HEARTBEAT_INTERVAL_MS"),
    ("EXECUTOR_MAX_OPEN_FILES", "3", ">= 16"),
    ("EXECUTOR_SANDBOX", "maybe", "true or false"),
    ("EXECUTOR_MEMORY_LIMIT_BYTES", "-1", ">= 0"),
    ("EXECUTOR_MAX_FILE_BYTES", "-1", ">= 0"),
    ("CALL_MAX_LOG_BYTES", "-1", ">= 0"),
    ("CALL_MAX_LOG_BYTES", "64k", "integer"),
    ("CALL_RECORD_MAX_BYTES", "-1", ">= 0"),
    ("CALL_RECORD_MAX_BYTES", "4MiB", "integer"),
    ("EXECUTOR_RUNTIME_DIR", "runtime", "must be an absolute path ('runtime')"),
    ("FUNCTIONS_DIR", "/nonexistent/functions", "directory"),
    ("IO_MEMORY_SEED_FILE", "/nonexistent/seed.json", "JSON object file"),
]


@pytest.mark.parametrize(("variable", "value", "words"), BAD)
def test_bad_values(functions_dir: Path, variable: str, value: str, words: str) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), variable: value}
    with pytest.raises(ConfigError) as err:
        load_call_settings(env)
    assert err.value.variable == variable
    assert words in str(err.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root Worker switches users")
def test_an_executor_user_that_does_not_exist(functions_dir: Path) -> None:
    env = {"FUNCTIONS_DIR": str(functions_dir), "EXECUTOR_USER": "no-such-user-3f9c"}
    with pytest.raises(ConfigError) as err:
        load_call_settings(env)
    assert err.value.variable == "EXECUTOR_USER"
    assert "names no user on this host ('no-such-user-3f9c')" in str(err.value)
