"""The SDK's signatures as a type checker sees them: a misspelt option is an error
under ``mypy --strict``, and a value asked for as a type is typed as that type.

Each line of the snippet that must be refused ends in ``# E: words``; mypy (its
API, with the repository's configuration) must report exactly those lines."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from mypy import api

from blockx_client import Client, SyncClient

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
from __future__ import annotations

import msgspec

from blockx_client import Client, SyncClient, Task, TaskResult, TaskUpdate


class Price(msgspec.Struct):
    usd: float


def sync_use(task: Task) -> None:
    with SyncClient(coordinator="127.0.0.1:8080", rpc_timeout_s=5.0) as client:
        result: TaskResult = client.run(task, deadline_s=3.0)
        names: list[str] = result.outputs(list[str])
        price: Price = client.function("price").call(1, result_type=Price)
        anything = client.function("price").call(1)
        for update in client.watch_tasks([result.task_id], worker_addr="127.0.0.1:9090"):
            assert isinstance(update, TaskUpdate)
        for each in client.run_many([task], concurrency=4):
            assert isinstance(each, TaskResult)
        client.run_with_retries(task, max_attempts=2, deadline_s=1.0)
        print(names, price, anything)
    SyncClient(coordinater="127.0.0.1:8080")  # E: Unexpected keyword argument "coordinater"
    with SyncClient() as client:
        client.run(task, deadline=3.0)  # E: Unexpected keyword argument "deadline"
        client.run_many([task], concurency=4)  # E: Unexpected keyword argument "concurency"
        client.run_with_retries(task, max_attempt=2)  # E: Unexpected keyword argument "max_attempt"
        client.reserve_worker_slot("t", deadline=1.0)  # E: Unexpected keyword argument "deadline"
        wrong: int = client.run(task).outputs(list[str])  # E: Incompatible types in assignment
        bad: str = client.function("price").call(1, result_type=Price)  # E: Incompatible types


async def async_use(client: Client, task: Task) -> None:
    price: Price = await client.function("price").call(1, result_type=Price)
    await client.run_with_retries(task, max_attempts=2, worker_addr="127.0.0.1:9090")
    await client.run_with_retries(task, deadline=1.0)  # E: Unexpected keyword argument "deadline"
    print(price)
"""


def test_mypy_strict_refuses_misspelt_options_and_types_converted_values(
    tmp_path: Path,
) -> None:
    snippet = tmp_path / "sdk_use.py"
    snippet.write_text(SNIPPET)
    expected = {
        n: line.split("# E: ", 1)[1]
        for n, line in enumerate(SNIPPET.splitlines(), start=1)
        if "# E: " in line
    }
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            str(snippet),
        ]
    )
    assert stderr == ""
    reported: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        if ": note: " in line:
            continue
        found = re.match(rf"{re.escape(str(snippet))}:(\d+): error: (.*)", line)
        assert found is not None, stdout
        reported.setdefault(int(found[1]), []).append(found[2])
    assert sorted(reported) == sorted(expected), stdout
    for n, words in expected.items():
        assert any(words in message for message in reported[n]), (n, reported[n])


def test_sync_client_takes_what_client_takes() -> None:
    """SyncClient spells out Client's options (for the type checker): the two lists
    must stay the same."""
    options = inspect.signature(Client.__init__).parameters
    sync_options = inspect.signature(SyncClient.__init__).parameters
    assert list(sync_options) == list(options)
    for name, param in options.items():
        assert (sync_options[name].kind, sync_options[name].default) == (
            param.kind,
            param.default,
        ), name
