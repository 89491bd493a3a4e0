"""Client values without a server: task parsing, routing, back-off."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from blockx_client import (
    Backoff,
    Cluster,
    PluginConfig,
    Task,
    TaskFileError,
    load_task_file,
    route,
    task_from_dict,
)
from blockx_client._convert import task_to_pb

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello_world.json"


def test_the_example_task_file_parses() -> None:
    task = load_task_file(EXAMPLE)
    # No task_id: each submission of the file gets its own (a fixed one would answer
    # an edited file with the first run's retained result).
    assert task.task_id == ""
    assert task.function_call_config == PluginConfig(
        type="CallListCallConfig",
        config={"function": "hello_world", "callList": [["ct2"], ["blockx"]]},
    )
    assert task.result_handler == PluginConfig(type="ReturnValueResultHandler", config={})
    assert task.task_timeout_ms == 30000
    pb = task_to_pb(task)
    assert pb.function_call_config is not None
    assert json.loads(pb.function_call_config.config)["function"] == "hello_world"


@pytest.mark.parametrize(
    "data",
    [
        {"taskId": "a", "functionCallConfig": {"type": "X", "config": {"k": 1}}},
        {"task_id": "a", "function_call_config": {"type": "X", "config": {"k": 1}}},
        {"task_id": "a", "function_call_config": {"type": "X", "config": '{"k": 1}'}},
    ],
)
def test_both_spellings_and_string_configs(data: dict[str, Any]) -> None:
    task = task_from_dict(data)
    assert task.task_id == "a"
    assert json.loads(task.function_call_config.config_text()) == {"k": 1}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "JSON object"),
        ({}, "functionCallConfig is required"),
        ({"functionCallConfig": {"config": {}}}, "non-empty 'type'"),
        ({"functionCallConfig": {"type": "X", "config": "{bad"}}, "not JSON"),
        ({"functionCallConfig": {"type": "X"}, "taskTimeoutMs": "soon"}, "integer"),
        ({"functionCallConfig": {"type": "X"}, "task_id": "a", "taskId": "b"}, "both"),
        ({"functionCallConfig": {"type": "X"}, "priority": 1}, "unknown field"),
    ],
)
def test_bad_task_dicts(data: Any, words: str) -> None:
    with pytest.raises(TaskFileError, match=words):
        task_from_dict(data)


def test_bad_task_files(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="cannot read"):
        load_task_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(TaskFileError, match="is not JSON"):
        load_task_file(tmp_path / "bad.json")
    # Deeper than json.loads can recurse: its RecursionError is no ValueError.
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TaskFileError, match="is not JSON: nested too deeply to decode"):
        load_task_file(tmp_path / "deep.json")
    deep_config = {"functionCallConfig": {"type": "X", "config": "[" * 100_000}}
    with pytest.raises(TaskFileError, match="config is a string but not JSON: nested too deeply"):
        task_from_dict(deep_config)


def test_generated_task_ids_are_stable_once_assigned() -> None:
    task = Task.call_list("f", [[1]]).with_id()
    assert task.task_id
    assert task.with_id() is task
    assert Task.call_list("f", [[1]]).with_id().task_id != task.task_id


def _task(builder: str, handler: str | None) -> Task:
    return Task(
        function_call_config=PluginConfig(type=builder),
        result_handler=PluginConfig(type=handler) if handler else None,
    )


@pytest.mark.parametrize(
    ("builder", "handler", "cluster"),
    [
        ("BlockTableCallConfig", None, Cluster.BLOCK),
        ("BlockTableCallConfig", "BlockWriteResultHandler", Cluster.BLOCK),
        ("BlockBundleCallConfig", None, Cluster.BUNDLE),
        ("BlockBundleCallConfig", "ReturnValueResultHandler", Cluster.BLOCK),
        ("InputsCallConfig", None, Cluster.BUNDLE),
        ("InputsCallConfig", "ReturnValueHandler", Cluster.BLOCK),
        ("CallListCallConfig", None, Cluster.BLOCK),
        ("CallListCallConfig", "ReturnValueResultHandler", Cluster.BLOCK),
        ("SomethingNew", None, Cluster.BLOCK),
    ],
)
def test_routing(builder: str, handler: str | None, cluster: Cluster) -> None:
    assert route(_task(builder, handler)) is cluster


def test_backoff_grows_with_jitter_and_stays_capped() -> None:
    backoff = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0)
    rng = random.Random(1)
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (30, 1.0)]:
        delays = [backoff.delay(attempt, rng.random()) for _ in range(200)]
        # Equal jitter: at least half the ceiling, never the whole of it.
        assert all(cap / 2 <= d < cap for d in delays)
        assert max(delays) > cap * 0.8  # jitter spreads over the range
        assert len(set(delays)) > 150


def test_one_task_state_for_client_and_server() -> None:
    import blockx_client
    from blockx_client._convert import state_from_pb
    from blockx_core.task import TaskState
    from blockx_proto import worker_v1

    assert blockx_client.TaskState is TaskState
    # A task the worker does not know travels as UNSPECIFIED and reads as NOT_FOUND.
    assert state_from_pb(worker_v1.TaskState.UNSPECIFIED) is TaskState.NOT_FOUND
    assert TaskState.NOT_FOUND.is_terminal
    assert [state_from_pb(s).value for s in list(worker_v1.TaskState)[1:]] == [
        "ALLOCATED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
    ]


@pytest.mark.parametrize("addr", ["nohost", "host:", "::1:80", "host:99999"])
def test_a_malformed_address_is_an_invalid_request(addr: str) -> None:
    from blockx_client import InvalidRequestError
    from blockx_client.transport import split_addr

    with pytest.raises(InvalidRequestError):
        split_addr(addr)
