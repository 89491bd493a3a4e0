"""Every ``blockx`` command through typer's runner, against a real local cluster
(etcd, coordinator, worker, sync invoker, proxy started by ``blockx-dev``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from blockx_cli.app import app
from blockx_cli.devcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TASK = ROOT / "examples" / "tasks" / "hello_world.json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    local = LocalCluster(ROOT / "examples", chain=False)
    try:
        yield local.wait_ready()
    finally:
        local.stop()


def blockx(cluster: dict[str, str], *args: str, proxy: bool = False) -> Any:
    """Run the CLI in-process; returns the click Result."""
    options = ["--etcd", cluster["etcd"]]
    if proxy:
        options += ["--proxy", cluster["proxy_socket"]]
    else:
        options += [
            "--coordinator",
            cluster["coordinator"],
            "--sync-invoker",
            cluster["sync_invoker"],
        ]
    return CliRunner().invoke(app, [*options, *args], catch_exceptions=False)


def as_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_reserve(cluster: dict[str, str]) -> None:
    data = as_json(blockx(cluster, "reserve", "--task-id", "cli-reserve", "--json"))
    assert data["task_id"] == "cli-reserve"
    assert data["worker_addr"] == cluster["worker"]
    assert data["slot_id"]


def test_submit_a_task_file_and_wait(cluster: dict[str, str]) -> None:
    result = blockx(cluster, "submit", str(EXAMPLE_TASK), "--task-id", "cli-file", "--wait")
    assert result.exit_code == 0, result.output
    assert "SUCCEEDED" in result.output
    assert '["hello, ct2", "hello, blockx"]' in result.output


def test_submit_from_flags_as_json(cluster: dict[str, str]) -> None:
    data = as_json(
        blockx(
            cluster,
            "submit",
            "--function",
            "hello_world",
            "--call",
            '["a"]',
            "--call",
            '["b"]',
            "--wait",
            "--json",
        )
    )
    assert data["state"] == "SUCCEEDED"
    assert data["plugin_results"][0]["result"] == ["hello, a", "hello, b"]


def test_submit_then_watch_then_get_result(cluster: dict[str, str]) -> None:
    placed = as_json(
        blockx(
            cluster,
            "submit",
            "--function",
            "hello_world",
            "--call",
            '["w"]',
            "--task-id",
            "cli-watch",
            "--json",
        )
    )
    assert placed["state"] == "RUNNING"
    worker = placed["worker_addr"]
    # One JSON object per line, per update as it came; the last is the end.
    watched = blockx(cluster, "watch", "cli-watch", "--worker", worker, "--json")
    assert watched.exit_code == 0, watched.output
    updates = [json.loads(line) for line in watched.stdout.splitlines()]
    assert {u["task_id"] for u in updates} == {"cli-watch"}
    assert [u["state"] for u in updates if u["is_terminal"]] == ["SUCCEEDED"]
    got = as_json(blockx(cluster, "get-result", "cli-watch", "--worker", worker, "--json"))
    assert got["plugin_results"][0]["result"] == ["hello, w"]
    # The live table, for people.
    live = blockx(cluster, "watch", "cli-watch", "--worker", worker)
    assert live.exit_code == 0, live.output
    assert "SUCCEEDED" in live.output


def test_a_failed_task_exits_1_and_shows_why(cluster: dict[str, str]) -> None:
    result = blockx(cluster, "submit", "--function", "no_such_fn", "--call", "[1]", "--wait")
    assert result.exit_code == 1
    assert "CALL_FAILED" in result.output
    assert "retryable=False" in result.output


def test_an_unknown_task_is_not_found_not_a_crash(cluster: dict[str, str]) -> None:
    result = blockx(cluster, "get-result", "never-there", "--worker", cluster["worker"])
    assert result.exit_code == 1
    assert "not known" in result.output


def test_invoke_and_debug_invoke(cluster: dict[str, str]) -> None:
    data = as_json(blockx(cluster, "invoke", "usd", "1000000000000000000", "2000", "--json"))
    assert data["success"] is True
    assert data["value"] == 2000.0
    assert data["durations_us"]["cpu"] >= 0
    debug = as_json(blockx(cluster, "invoke", "greet_account", "0xabc", "--debug", "--json"))
    assert debug["value"] == {"address": "0xabc", "balance": "1.5000 ETH"}
    assert [t["op"] for t in debug["io_trace"]] == ["get"]
    people = blockx(cluster, "invoke", "hello_world", "cli")
    assert people.exit_code == 0
    assert '"hello, cli"' in people.output


def test_invoke_a_missing_function_exits_1(cluster: dict[str, str]) -> None:
    result = blockx(cluster, "invoke", "nope")
    assert result.exit_code == 1
    assert "FUNCTION_NOT_FOUND" in result.output


def test_precheck(cluster: dict[str, str]) -> None:
    ok = blockx(cluster, "precheck", "hello_world", '"x"')
    assert ok.exit_code == 0, ok.output
    assert "(name)" in ok.output
    bad = as_json_any(blockx(cluster, "precheck", "hello_world", "1", "2", "--json"))
    assert bad["ok"] is False
    assert bad["failure_code"] == "SIGNATURE_MISMATCH"


def as_json_any(result: Any) -> Any:
    return json.loads(result.stdout)


def test_workers(cluster: dict[str, str]) -> None:
    data = as_json(blockx(cluster, "workers", "--json"))
    assert [w["worker_addr"] for w in data] == [cluster["worker"]]
    assert data[0]["task_slots"] == 50
    table = blockx(cluster, "workers")
    assert table.exit_code == 0
    assert cluster["worker"] in table.output


def test_everything_through_the_proxy(cluster: dict[str, str]) -> None:
    result = blockx(
        cluster,
        "submit",
        "--function",
        "hello_world",
        "--call",
        '["p"]',
        "--wait",
        "--json",
        proxy=True,
    )
    data = as_json(result)
    assert data["plugin_results"][0]["result"] == ["hello, p"]
    invoked = as_json(blockx(cluster, "invoke", "hello_world", "q", "--json", proxy=True))
    assert invoked["value"] == "hello, q"


def test_a_malformed_task_file_is_a_usage_error(cluster: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"functionCallConfig": {"config": {}}}')
    result = blockx(cluster, "submit", str(bad))
    assert result.exit_code == 2
    assert "non-empty 'type'" in result.output
    assert "Traceback" not in result.output


def test_an_unreachable_coordinator_is_one_line_and_exit_3() -> None:
    result = CliRunner().invoke(
        app, ["--coordinator", "127.0.0.1:1", "reserve", "--timeout", "2"], catch_exceptions=False
    )
    assert result.exit_code == 3
    assert "cannot reach 127.0.0.1:1" in result.output
    assert "blockx dev up" in result.output
    assert "Traceback" not in result.output


HOSTILE = "[/][bold]x[/bold]"  # rich markup, which would fail or restyle the output


def test_markup_in_ids_and_messages_is_printed_as_text(cluster: dict[str, str]) -> None:
    task_id, function = f"cli-{HOSTILE}", f"no_such_{HOSTILE}"
    failed = blockx(
        cluster, "submit", "--function", function, "--call", "[1]", "--task-id", task_id, "--wait"
    )
    assert failed.exit_code == 1, failed.output
    assert task_id in failed.output
    worker = cluster["worker"]
    for args, code in (
        (("watch", task_id, "--worker", worker), 1),  # the task failed
        (("get-result", task_id, "--worker", worker), 1),
        (("tasks", "--function", function), 0),
    ):
        shown = blockx(cluster, *args)
        assert shown.exit_code == code, (args, shown.output)
        assert task_id in shown.output, (args, shown.output)
    missing = blockx(cluster, "invoke", function)
    assert missing.exit_code == 1
    assert function in missing.output
    unknown = blockx(cluster, "get-result", HOSTILE, "--worker", worker)
    assert unknown.exit_code == 1
    assert HOSTILE in unknown.output


def test_the_watch_hint_can_be_pasted_into_a_shell(cluster: dict[str, str]) -> None:
    placed = blockx(
        cluster, "submit", "--function", "hello_world", "--call", '["q"]', "--task-id", "two words"
    )
    assert placed.exit_code == 0, placed.output
    assert f"blockx watch 'two words' --worker {cluster['worker']}" in placed.output
