"""``--config FILE``: settings from TOML under the environment, for every server program."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from support import free_port, wait_until

from blockx_core.environ import EnvironOverFile
from blockx_server.runtime.config_file import ConfigFileError, read_config_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = [
    "blockx-coordinator",
    "blockx-bundle-coordinator",
    "blockx-worker",
    "blockx-bundle-worker",
    "blockx-syncinvoker",
    "blockx-proxy",
]
KNOWN = ["TASK_SLOTS", "ETCD_ENDPOINTS", "EXECUTOR_SANDBOX", "CALL_DEADLINE_MS", "RATIO"]

VALUES = [
    # (TOML line, the environment text the setting's parser gets)
    ("TASK_SLOTS = 50", {"TASK_SLOTS": "50"}),
    ('TASK_SLOTS = "50"', {"TASK_SLOTS": "50"}),
    ("EXECUTOR_SANDBOX = false", {"EXECUTOR_SANDBOX": "false"}),
    ('ETCD_ENDPOINTS = ["a:2379", "b:2379"]', {"ETCD_ENDPOINTS": "a:2379,b:2379"}),
    ("RATIO = 0.5", {"RATIO": "0.5"}),
]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "blockx.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("line", "expected"), VALUES)
def test_values_become_the_environment_text(
    tmp_path: Path, line: str, expected: dict[str, str]
) -> None:
    assert read_config_file(_file(tmp_path, line + "\n"), KNOWN) == expected


PROBLEMS = [
    # (file text, the lines of the error)
    ("TASK_SLOST = 5\n", ["{path}: unknown key TASK_SLOST; did you mean TASK_SLOTS?"]),
    ("ZZZ = 1\n", ["{path}: unknown key ZZZ (--help lists the settings)"]),
    (
        "[worker]\nTASK_SLOTS = 5\n",
        ["{path}: unknown key worker (--help lists the settings)"],
    ),
    (
        "TASK_SLOTS = 1979-05-27\n",
        ["{path}: TASK_SLOTS must be a string, a number, a boolean or an array of them"],
    ),
    ("TASK_SLOTS = \n", ["{path} is not valid TOML: Invalid value (at line 1, column 14)"]),
]


@pytest.mark.parametrize(("text", "lines"), PROBLEMS)
def test_every_problem_is_one_line_naming_the_key(
    tmp_path: Path, text: str, lines: list[str]
) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigFileError) as err:
        read_config_file(path, KNOWN)
    assert err.value.lines == [line.format(path=path) for line in lines]


def test_the_environment_wins_unless_blank() -> None:
    layered = EnvironOverFile(
        {"TASK_SLOTS": "7", "CALL_DEADLINE_MS": "  "}, {"TASK_SLOTS": "50", "CALL_DEADLINE_MS": "9"}
    )
    assert layered["TASK_SLOTS"] == "7"
    assert layered["CALL_DEADLINE_MS"] == "9"  # blank in the environment: unset
    assert not layered.from_file("TASK_SLOTS")
    assert layered.from_file("CALL_DEADLINE_MS")
    assert "ETCD_ENDPOINTS" not in layered


def _run(program: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(program)
    assert binary is not None, f"{program} is not installed (uv sync)"
    return subprocess.run(
        [binary, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_reads_config_and_refuses_an_unknown_key(
    program: str, tmp_path: Path
) -> None:
    path = _file(tmp_path, 'BLOCKX_LOG_LEVEL = "loud"\nBLOCKX_LOG_LEVLE = "DEBUG"\n')
    unknown = _run(program, "--config", str(path), env={})
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        f"{program}: invalid configuration: {path}: unknown key BLOCKX_LOG_LEVLE; "
        "did you mean BLOCKX_LOG_LEVEL?"
    ]
    # A bad value from the file says where it came from; the environment's wins.
    path.write_text('BLOCKX_LOG_LEVEL = "loud"\n')
    bad = _run(program, f"--config={path}", env={})
    assert bad.returncode == 2
    assert (
        f"{program}: invalid configuration: BLOCKX_LOG_LEVEL must be one of DEBUG, INFO, "
        f"WARNING, ERROR (got 'LOUD') (in {path})"
    ) in bad.stderr.splitlines()
    overridden = _run(program, "--config", str(path), env={"BLOCKX_LOG_LEVEL": "quiet"})
    assert "(got 'QUIET')" in overridden.stderr
    assert "(got 'LOUD')" not in overridden.stderr
    assert "Traceback" not in unknown.stderr + bad.stderr + overridden.stderr


def test_help_documents_config(tmp_path: Path) -> None:
    result = _run("blockx-worker", "--help", env={})
    lines = result.stdout.splitlines()
    assert lines[1] == "       blockx-worker [--config FILE]"
    assert any("--config FILE reads them from a TOML file" in line for line in lines)
    missing = _run("blockx-worker", "--config", str(tmp_path / "none.toml"), env={})
    assert missing.returncode == 2
    assert missing.stderr == (
        f"blockx-worker: invalid configuration: cannot read {tmp_path / 'none.toml'}: "
        "No such file or directory\n"
    )


async def _serving(port: int) -> bool:
    channel = Channel("127.0.0.1", port)
    try:
        request = HealthCheckRequest(service="syncinvoker.v1.SyncInvokerService")
        reply = await HealthStub(channel).Check(request, timeout=2)
    except (GRPCError, OSError, TimeoutError):
        return False
    finally:
        channel.close()
    return bool(reply.status == HealthCheckResponse.SERVING)


def _metrics_answer(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


async def test_a_server_serves_from_its_file_under_the_environment(tmp_path: Path) -> None:
    """The Sync Invoker takes FUNCTIONS_DIR and the metrics address from the file, and
    its listen address from the environment, which names another port than the file."""
    file_port, env_port, metrics_port = free_port(), free_port(), free_port()
    path = _file(
        tmp_path,
        f'SYNC_INVOKER_LISTEN = "127.0.0.1:{file_port}"\n'
        f"FUNCTIONS_DIR = {str(EXAMPLES / 'functions')!r}\n"
        "EXECUTOR_COUNT = 1\n"
        f'BLOCKX_PROMETHEUS_LISTEN_ADDR = "127.0.0.1:{metrics_port}"\n',
    )
    binary = shutil.which("blockx-syncinvoker")
    assert binary is not None
    log = (tmp_path / "syncinvoker.log").open("wb")
    env = {**os.environ, "SYNC_INVOKER_LISTEN": f"127.0.0.1:{env_port}"}
    env.pop("FUNCTIONS_DIR", None)
    proc = await asyncio.create_subprocess_exec(
        binary, "--config", str(path), env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:

        async def up() -> bool:
            assert proc.returncode is None, (tmp_path / "syncinvoker.log").read_text()
            return await _serving(env_port)

        await wait_until(up, timeout=60)
        assert not await _serving(file_port)
        assert await asyncio.to_thread(_metrics_answer, metrics_port)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), timeout=30)
        log.close()
    assert proc.returncode == 0, (tmp_path / "syncinvoker.log").read_text()
