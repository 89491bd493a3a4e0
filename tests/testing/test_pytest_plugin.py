"""The blockx-testing pytest plugin as a user's project loads it: a pytest run in a
project of its own (functions, a fixture file, the ``blockx_functions`` ini option)
replays calls in real executors through ``blockx_replay`` and ``run_function``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from blockx_core.call_record import CallRecord, RecordedError, RecordedIo, encode_record
from blockx_core.failures import IoErrorKind

FUNCTIONS = """\
from blockx_executor import io


async def balance_of(account):
    balance = await io.rpc.eth_getBalance(account, "latest")
    return int(balance, 16)


def parse(text):
    return int(text)
"""

TESTS = """\
import pytest

from blockx_testing import CallFailed, ReplayFailed, run_function


def test_fixture_answers(blockx_replay):
    assert blockx_replay.run(fixture="fixtures/balance.json") == 255
    assert blockx_replay.run("balance_of", ["0xb"], fixture="fixtures/balance.json") == 1


def test_an_error_answer_is_raised(blockx_replay):
    outcome = blockx_replay.outcome("balance_of", ["0xdead"], fixture="fixtures/balance.json")
    assert isinstance(outcome, ReplayFailed)
    assert outcome.failure.message.startswith("IoError: UNAVAILABLE: node down")


def test_a_user_error_names_the_line():
    with pytest.raises(CallFailed) as failed:
        run_function("parse", ["x"], functions="functions")
    assert failed.value.kind == "USER_ERROR"
    assert 'File "wallet.py", line 10, in parse' in failed.value.message


async def test_from_an_async_test_too(blockx_replay):
    assert blockx_replay.run("parse", ["12"]) == 12
"""


def test_a_project_tests_its_functions_offline_with_the_plugin(tmp_path: Path) -> None:
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "wallet.py").write_text(FUNCTIONS)
    (tmp_path / "fixtures").mkdir()
    record = CallRecord(
        function="balance_of",
        args=["0xa"],
        io=[
            RecordedIo(backend="rpc", op="eth_getBalance", args=["0xa", "latest"], answer="0xff"),
            RecordedIo(backend="rpc", op="eth_getBalance", args=["0xb", "latest"], answer="0x1"),
            RecordedIo(
                backend="rpc",
                op="eth_getBalance",
                args=["0xdead", "latest"],
                error=RecordedError(kind=IoErrorKind.UNAVAILABLE, message="node down"),
            ),
        ],
    )
    (tmp_path / "fixtures" / "balance.json").write_bytes(encode_record(record))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_wallet.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nblockx_functions = functions\nasyncio_mode = auto\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
