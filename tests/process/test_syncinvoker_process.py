"""The real ``blockx-syncinvoker`` console script: configuration, health, an
Invoke of the example functions, metrics, and a clean SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import EXAMPLES, SyncInvokerProcess
from support import free_port

from blockx_proto import syncinvoker_v1 as pb


@pytest.fixture
def invoker(tmp_path: Path) -> Iterator[SyncInvokerProcess]:
    process = SyncInvokerProcess({}, tmp_path / "syncinvoker.log")
    yield process
    if process.alive():
        process.kill()


async def test_serves_invokes_of_the_example_functions_and_stops_on_sigterm(
    invoker: SyncInvokerProcess,
) -> None:
    await invoker.wait_ready()
    channel = invoker.channel()
    try:
        stub = pb.SyncInvokerServiceStub(channel)
        hello = await stub.invoke(
            pb.InvokeRequest(function="hello_world", args='["ct2"]'), timeout=10
        )
        assert hello.success, hello.failure_message
        assert json.loads(hello.result) == "hello, ct2"
        assert hello.code_epoch == 1
        # IO and a sub-call, through the real memory seed.
        greet = await stub.invoke(
            pb.InvokeRequest(function="greet_account", args='["0xabc"]'), timeout=10
        )
        assert json.loads(greet.result) == {"address": "0xabc", "balance": "1.5000 ETH"}
        check = await stub.precheck(pb.PrecheckRequest(function="hello_world", args="[]"))
        assert check.failure_code == "SIGNATURE_MISMATCH"
        assert check.signature == "(name)"
    finally:
        channel.close()
    metrics = invoker.metrics()
    assert 'blockx_syncinvoker_requests_total{outcome="ok",rpc="Invoke"} 2.0' in metrics
    assert 'blockx_syncinvoker_requests_total{outcome="SIGNATURE_MISMATCH",rpc="Precheck"}' in (
        metrics
    )
    assert "blockx_syncinvoker_invoke_duration_seconds_bucket" in metrics
    assert "blockx_syncinvoker_ready 1.0" in metrics
    assert invoker.stop() == 0
    assert "stopped" in invoker.output()
    assert "Traceback" not in invoker.output()


async def test_sigint_stops_it_too(invoker: SyncInvokerProcess) -> None:
    await invoker.wait_ready()
    invoker.proc.send_signal(signal.SIGINT)
    assert invoker.proc.wait(timeout=30) == 0
    assert "Traceback" not in invoker.output()


BAD_CONFIGS = [
    # (environment, the variable the one line names)
    ({"SYNC_INVOKER_MAX_CONCURRENT": "0"}, "SYNC_INVOKER_MAX_CONCURRENT must be >= 1"),
    ({"SYNC_INVOKER_LISTEN": "no-port"}, "SYNC_INVOKER_LISTEN must be host:port"),
    ({"MAX_INVOKE_TIMEOUT_MS": "100"}, "MAX_INVOKE_TIMEOUT_MS must be >= CALL_DEADLINE_MS"),
    ({"MAX_INVOKE_TIMEOUT_MS": "soon"}, "MAX_INVOKE_TIMEOUT_MS must be an integer"),
    ({"FUNCTIONS_DIR": "/nonexistent/functions"}, "FUNCTIONS_DIR must be a directory"),
    ({"BLOCKX_LOG_LEVEL": "LOUD"}, "BLOCKX_LOG_LEVEL must be one of"),
    ({"DRAIN_TIMEOUT_MS": "-1"}, "DRAIN_TIMEOUT_MS must be >= 0"),
]


@pytest.mark.parametrize(("env", "words"), BAD_CONFIGS)
def test_a_bad_configuration_is_one_line_and_exit_2(env: dict[str, str], words: str) -> None:
    binary = shutil.which("blockx-syncinvoker")
    assert binary is not None
    base = {
        "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        "SYNC_INVOKER_LISTEN": f"127.0.0.1:{free_port()}",
    }
    done = subprocess.run(
        [binary],
        env={**os.environ, **base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("blockx-syncinvoker: invalid configuration: "), lines
    assert words in lines[0]
    assert done.stdout == ""


def test_a_bad_memory_seed_is_one_line_and_exit_2(tmp_path: Path) -> None:
    seed = tmp_path / "seed.json"
    seed.write_text("[1, 2]")
    binary = shutil.which("blockx-syncinvoker")
    assert binary is not None
    done = subprocess.run(
        [binary],
        env={
            **os.environ,
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
            "IO_MEMORY_SEED_FILE": str(seed),
            "SYNC_INVOKER_LISTEN": f"127.0.0.1:{free_port()}",
            "BLOCKX_LOG_LEVEL": "ERROR",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"blockx-syncinvoker: cannot start: IO_MEMORY_SEED_FILE: memory seed {seed} "
        "must hold a JSON object"
    ]
