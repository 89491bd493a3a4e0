"""Server programs answer --help and --version instead of starting, as real processes."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess

import pytest
from processes import EXAMPLES
from support import free_port

# (program, variables its --help must list)
PROGRAMS = [
    ("blockx-coordinator", ["COORDINATOR_LISTEN", "COORDINATOR_MAX_CANDIDATES", "ETCD_ENDPOINTS"]),
    ("blockx-bundle-coordinator", ["COORDINATOR_REGISTRY_PREFIXES", "BLOCKX_LOG_LEVEL"]),
    ("blockx-worker", ["WORKER_LISTEN", "TASK_SLOTS", "EXECUTOR_COUNT", "PLUGIN_SLOTS"]),
    ("blockx-bundle-worker", ["WORKER_REGISTRY_PREFIX", "FUNCTIONS_DIR"]),
    ("blockx-syncinvoker", ["SYNC_INVOKER_LISTEN", "MAX_INVOKE_TIMEOUT_MS", "CALL_DEADLINE_MS"]),
    ("blockx-proxy", ["PROXY_SOCKET_PATH", "PROXY_COORDINATOR_ADDR"]),
]
NAMES = [program for program, _ in PROGRAMS]


def _run(
    program: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(program)
    assert binary is not None, f"{program} is not installed (uv sync)"
    return subprocess.run(
        [binary, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(("program", "variables"), PROGRAMS)
def test_help_lists_the_variables_with_defaults(program: str, variables: list[str]) -> None:
    # A bad variable does not matter: --help answers before the configuration is read.
    result = _run(program, "--help", env={"BLOCKX_LOG_LEVEL": "loud"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == f"usage: {program} [--help | --version]"
    for variable in variables:
        assert any(line.startswith(f"  {variable} (default: ") for line in lines), variable


def test_help_shows_the_defaults() -> None:
    lines = _run("blockx-bundle-worker", "--help").stdout.splitlines()
    assert "  TASK_SLOTS (default: 50)" in lines
    assert "  WORKER_REGISTRY_PREFIX (default: /blockx/bundle-workers/)" in lines
    assert "  EXECUTOR_SANDBOX (default: true)" in lines


@pytest.mark.parametrize("program", NAMES)
def test_version_is_the_package_version(program: str) -> None:
    result = _run(program, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{program} {importlib.metadata.version('blockx-server')}\n"
    assert result.stderr == ""


@pytest.mark.parametrize("program", NAMES)
def test_an_unknown_argument_is_one_usage_line_and_exit_2(program: str) -> None:
    result = _run(program, "--port", "80")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"usage: {program} [--help | --version]")
    assert "--port 80" in lines[0]
    assert result.stdout == ""


def test_every_bad_variable_is_one_line_and_exit_2() -> None:
    env = {
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        "WORKER_LISTEN": f"127.0.0.1:{free_port()}",
        "TASK_SLOTS": "0",
        "EXECUTOR_SANDBOX": "maybe",
        "BLOCKX_LOG_LEVEL": "loud",
    }
    result = _run("blockx-worker", env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "blockx-worker: invalid configuration: TASK_SLOTS must be >= 1 (got 0)",
        "blockx-worker: invalid configuration: EXECUTOR_SANDBOX must be true or false "
        "(got 'maybe')",
        "blockx-worker: invalid configuration: BLOCKX_LOG_LEVEL must be one of DEBUG, INFO, "
        "WARNING, ERROR (got 'LOUD')",
    ]
    assert result.stdout == ""
