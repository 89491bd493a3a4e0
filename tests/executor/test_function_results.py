"""What a function returns, through real executor processes: strict JSON or
BAD_RESULT naming where and what; asyncio fails with a TypeError that says what to
await instead."""

from __future__ import annotations

import asyncio
import json

import pytest

from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, CallsFailed, ConvergeTaskCalls
from blockx_server.calls.engine import CallEngine
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

FUNCTIONS = """
import asyncio
import datetime
import decimal
import enum
import math
from blockx_executor import call, io


class Color(enum.StrEnum):
    RED = "red"


def a_set():
    return {"a": [1, 2, {3}]}

def raw_bytes():
    return [b"\\x00"]

def a_datetime():
    return {"at": datetime.datetime(2026, 1, 1)}

def not_a_number():
    return [1.0, math.nan]

def infinite():
    return {"x": {"y": math.inf}}

def int_keys():
    return {"ok": {1: "one"}}

def a_decimal():
    return decimal.Decimal("1.5")

def fine():
    return {"t": (1, 2), "c": Color.RED, "f": 1.5, "n": None, "big": 10**30}

def nested(levels):
    value = []
    for _ in range(levels - 1):
        value = [value]
    return value

def too_deep():
    return {"a": nested(600)}

def wide():
    return [{"i": i, "b": "[{" * 3} for i in range(2000)]

async def sleeps():
    await asyncio.sleep(1)

async def gathers():
    await asyncio.gather(io.memory.get("a"))

async def waits_on_event():
    await asyncio.Event().wait()

def runs_its_own_loop():
    async def inner():
        return 7
    return asyncio.run(inner())

def awaits_a_sub_call_on_its_own_loop():
    async def inner():
        return await call("fine")
    return asyncio.run(inner())
"""


@pytest.fixture
def snapshot() -> CodeSnapshot:
    return build_snapshot(1, {"fns": FUNCTIONS})


def failed(result: ConvergeTaskCalls) -> CallsFailed:
    assert isinstance(result, CallsFailed), result
    return result


async def run(engine: CallEngine, snapshot: CodeSnapshot, function: str) -> ConvergeTaskCalls:
    io = TaskIoScope(IoRouter([MemoryBackend({"a": 1})]), f"task-{function}")
    async with asyncio.timeout(30):
        return await engine.run_calls(f"task-{function}", snapshot, io, function, [[]])


@pytest.mark.parametrize(
    ("function", "words"),
    [
        ("a_set", 'result["a"][2]: set is not JSON (return a list, e.g. sorted(...))'),
        ("raw_bytes", "result[0]: bytes is not JSON (return text, e.g. .hex() or .decode())"),
        ("a_datetime", 'result["at"]: datetime is not JSON'),
        ("not_a_number", "result[1]: nan is not JSON"),
        ("infinite", 'result["x"]["y"]: inf is not JSON'),
        ("int_keys", 'result["ok"]: key 1 is int, not str'),
        ("a_decimal", "result: Decimal is not JSON"),
        ("too_deep", "result: nested more than 512 containers deep (return a flatter value)"),
    ],
)
async def test_values_json_cannot_hold_fail_as_bad_result(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, words: str
) -> None:
    result = await run(engine, snapshot, function)
    assert isinstance(result, CallsFailed)
    assert "BAD_RESULT: the return value is not JSON data: " in result.failure_message
    assert words in result.failure_message


async def test_results_up_to_the_depth_bound_pass_however_wide(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    io = TaskIoScope(IoRouter([MemoryBackend({})]), "task-depth")
    async with asyncio.timeout(30):
        deepest = await engine.run_calls("task-depth", snapshot, io, "nested", [[512]])
        wide = await engine.run_calls("task-wide", snapshot, io, "wide", [[]])
    assert isinstance(deepest, CallsConverged), deepest
    value = json.loads(deepest.outputs[0].value_json)
    levels = 0
    while isinstance(value, list):
        levels += 1
        value = value[0] if value else None
    assert levels == 512
    assert isinstance(wide, CallsConverged), wide
    assert len(json.loads(wide.outputs[0].value_json)) == 2000


async def test_json_data_and_tuples_pass(engine: CallEngine, snapshot: CodeSnapshot) -> None:
    result = await run(engine, snapshot, "fine")
    assert isinstance(result, CallsConverged), result
    assert [json.loads(o.value_json) for o in result.outputs] == [
        {"t": [1, 2], "c": "red", "f": 1.5, "n": None, "big": 10**30}
    ]


@pytest.mark.parametrize(
    ("function", "asked"),
    [
        ("sleeps", "create_future"),
        ("gathers", ""),
        ("waits_on_event", ""),
    ],
)
async def test_asyncio_fails_with_a_type_error_that_says_what_to_await(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, asked: str
) -> None:
    message = failed(await run(engine, snapshot, function)).failure_message
    assert "USER_ERROR: TypeError: asyncio cannot be used in a BlockX function" in message
    assert f"event loop for {asked}" in message
    assert "Await io.<backend>.<op>(...) or call(...)" in message
    assert "RuntimeError" not in message


async def test_a_plain_def_may_still_run_its_own_loop(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    result = await run(engine, snapshot, "runs_its_own_loop")
    assert isinstance(result, CallsConverged), result
    assert [json.loads(o.value_json) for o in result.outputs] == [7]


async def test_a_plain_def_awaiting_a_sub_call_on_its_own_loop_is_told_why_not(
    engine: CallEngine, snapshot: CodeSnapshot
) -> None:
    message = failed(
        await run(engine, snapshot, "awaits_a_sub_call_on_its_own_loop")
    ).failure_message
    assert (
        "USER_ERROR: RuntimeError: call('fine') was awaited on an event loop of the "
        "function's own (asyncio.run in a plain def?): only an async def function can await"
    ) in message
    assert "bad yield" not in message


async def test_asyncio_imported_in_the_middle_of_a_call_fails_the_same_way(
    engine: CallEngine,
) -> None:
    # A fresh executor, and a module that imports asyncio only inside the call.
    late = "async def late():\n    import asyncio\n    await asyncio.sleep(1)\n"
    message = failed(await run(engine, build_snapshot(1, {"late": late}), "late")).failure_message
    assert "TypeError: asyncio cannot be used in a BlockX function" in message
