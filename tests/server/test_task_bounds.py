"""TASK_MAX_CALLS in the Builders and the streamed scan, and Offload, in process.

The listed Builders' ``build_listed`` against their ``build`` (the same calls, the
same refusals), ``count_listed`` on configs of every shape, ``feed_calls`` with a
limit against a recording run, and ``Offload``: small inputs inline, large ones
on a thread while the event loop keeps running
(the offloaded function waits for the loop to answer it, so a parse on the loop
could never finish).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_core.calls import RootCall
from blockx_core.code_view import CodeSnapshot
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import PluginError, count_listed, feed_calls
from blockx_server.pipeline.builders.call_list import CallListCallConfig
from blockx_server.pipeline.builders.inputs import MAX_INPUTS, InputsCallConfig
from blockx_server.pipeline.context import TaskContext
from blockx_server.worker.offload import Offload

COUNTS = [
    # (config, field, at_most, count)
    ('{"callList": []}', "callList", 3, 0),
    ('{"callList": [[1], [2], [3]]}', "callList", 3, 3),
    ('{"callList": [[1], [2], [3], [4], [5]]}', "callList", 3, 4),  # stops past the limit
    ('{"function": "f", "callList": [[1], "x", {"a": [1]}]}', "callList", 9, 3),
    ('{"callList": [[1]], "inputs": [{}, {}]}', "inputs", 9, 2),
    ('{"function": "f"}', "callList", 9, 0),
    ('{"callList": 7}', "callList", 9, 0),
    ("[1, 2, 3]", "callList", 9, 0),
]


@pytest.mark.parametrize(("config", "field", "at_most", "count"), COUNTS)
def test_count_listed(config: str, field: str, at_most: int, count: int) -> None:
    assert count_listed(config, field, at_most) == count


def context() -> TaskContext:
    return TaskContext(
        task=TaskInput(task_id="t1", function_call_config=PluginConfig(type="x")),
        deadline_ms=0,
        code=CodeSnapshot(epoch=1, modules={}, functions={}, parse_errors={}),
        io=TaskIoScope(IoRouter(), "t1"),
    )


LISTED = [
    (CallListCallConfig(), {"function": "f", "callList": [[1], [2, "a"], [[3]], []]}),
    (CallListCallConfig(), {"function": "f", "callList": []}),
    (InputsCallConfig(), {"function": "f", "inputs": [{"a": 1}, {"b": [2]}, {}]}),
]


@pytest.mark.parametrize(("builder", "config"), LISTED)
async def test_build_listed_makes_the_calls_build_makes(builder: Any, config: Any) -> None:
    assert builder.build_listed(json.dumps(config), 10) == await builder.build(context(), config)


REFUSED = [
    (CallListCallConfig(), {"function": "f", "callList": [[1], 2]}, "Expected `array`, got `int`"),
    (CallListCallConfig(), {"function": "f"}, "missing required field `callList`"),
    (CallListCallConfig(), {"function": "", "callList": []}, "`function` must not be empty"),
    (CallListCallConfig(), {"function": "f", "callList": [], "x": 1}, "unknown field `x`"),
    (InputsCallConfig(), {"function": "f", "inputs": [[1]]}, "must be an object"),
    (InputsCallConfig(), {"function": "f", "inputs": [{"a b": 1}]}, "not a keyword"),
    (InputsCallConfig(), {"function": "f"}, "expected"),
]


@pytest.mark.parametrize(("builder", "config", "words"), REFUSED)
async def test_build_listed_refuses_what_build_refuses(
    builder: Any, config: Any, words: str
) -> None:
    with pytest.raises(PluginError, match=words) as listed:
        builder.build_listed(json.dumps(config), 10)
    with pytest.raises(PluginError, match=words) as built:
        await builder.build(context(), config)
    assert not listed.value.retryable
    assert not built.value.retryable


@pytest.mark.parametrize(
    ("builder", "config"),
    [
        (CallListCallConfig(), {"function": "f", "callList": [[i] for i in range(4)]}),
        (InputsCallConfig(), {"function": "f", "inputs": [{"a": i} for i in range(4)]}),
    ],
)
def test_more_calls_than_the_limit_are_refused_naming_task_max_calls(
    builder: Any, config: Any
) -> None:
    text = json.dumps(config)
    assert len(builder.build_listed(text, 4).calls) == 4
    with pytest.raises(PluginError) as info:
        builder.build_listed(text, 3)
    name = type(builder).__name__
    assert info.value.message == (
        f"{name}: more than TASK_MAX_CALLS (3) calls in one task; split the task"
    )
    assert not info.value.retryable


def test_inputs_keep_their_own_lower_bound() -> None:
    config = json.dumps({"function": "f", "inputs": [{}] * (MAX_INPUTS + 1)})
    with pytest.raises(PluginError, match=f"more than {MAX_INPUTS} inputs"):
        InputsCallConfig().build_listed(config, 10 * MAX_INPUTS)


class ScriptedStream:
    """Chunks of consecutive integer roots."""

    function = "f"

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    async def chunks(self) -> AsyncGenerator[Sequence[RootCall]]:
        next_root = 0
        for size in self.sizes:
            yield [RootCall([next_root + j]) for j in range(size)]
            next_root += size


class RecordingRun:
    """A CallRun that always has room and records what it is given."""

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.done_calls = 0
        self.closed = False

    @property
    def ended(self) -> bool:
        return False

    async def wait_room(self) -> None:
        pass

    def add(self, roots: Sequence[RootCall]) -> None:
        self.roots.extend(r.args[0] for r in roots)

    def done(self) -> None:
        self.done_calls += 1

    def close(self) -> None:
        self.closed = True


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    max_calls=st.integers(min_value=0, max_value=200),
)
def test_a_streamed_scan_never_adds_past_task_max_calls(sizes: list[int], max_calls: int) -> None:
    stream, run = ScriptedStream(sizes), RecordingRun()
    if sum(sizes) <= max_calls:
        assert asyncio.run(feed_calls(stream, run, max_calls)) == sum(sizes)
        assert run.done_calls == 1
        return
    with pytest.raises(PluginError, match=rf"TASK_MAX_CALLS \({max_calls}\)"):
        asyncio.run(feed_calls(stream, run, max_calls))
    # Every chunk before the one that crosses the limit, and nothing of that one.
    added = 0
    for size in sizes:
        if added + size > max_calls:
            break
        added += size
    assert run.roots == list(range(added))
    assert run.closed
    assert run.done_calls == 0


async def test_small_work_runs_inline_on_the_loop_thread() -> None:
    offloaded: list[str] = []
    offload = Offload(from_chars=100, on_offloaded=offloaded.append)
    try:
        assert await offload.run("builder", 99, threading.get_ident) == threading.get_ident()
    finally:
        offload.close()
    assert offloaded == []


async def test_large_work_runs_on_a_thread_while_the_loop_keeps_serving() -> None:
    """The offloaded function asks the loop a question and waits for its answer."""
    loop = asyncio.get_running_loop()
    offloaded: list[str] = []
    offload = Offload(from_chars=100, on_offloaded=offloaded.append)
    answered = threading.Event()

    def parse() -> int:
        loop.call_soon_threadsafe(answered.set)
        assert answered.wait(timeout=30), "the event loop did not run during the parse"
        return threading.get_ident()

    try:
        parsed_on = await offload.run("builder", 100, parse)
    finally:
        offload.close()
    assert parsed_on != threading.get_ident()
    assert offloaded == ["builder"]
