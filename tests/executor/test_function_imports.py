"""Imports between function modules, through real executor processes: each module
sees its siblings of the same code epoch, whatever the files say by now."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from blockx_core.code_view import CodeSnapshot, build_snapshot
from blockx_core.dispatch import CallsConverged, CallsFailed, ConvergeTaskCalls
from blockx_server.calls.engine import CallEngine
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

MAIN = """
import helpers
from helpers import VALUE as imported_value
from . import helpers as relative
from .helpers import VALUE as relative_value

def value():
    return [helpers.VALUE, imported_value, relative.VALUE, relative_value]

def lazily():
    import helpers
    return helpers.twice(21)

def note(who):
    helpers.SEEN.append(who)
    return list(helpers.SEEN)
"""

OTHER = """
from . import helpers

def other_note(who):
    helpers.SEEN.append(who)
    return list(helpers.SEEN)
"""


def helpers(value: int) -> str:
    return f"VALUE = {value}\nSEEN = []\n\ndef twice(x):\n    return 2 * x\n"


_runs = iter(range(1_000_000))


async def run(
    engine: CallEngine, snapshot: CodeSnapshot, function: str, *args: Any
) -> ConvergeTaskCalls:
    task_id = f"task-{next(_runs)}"
    io = TaskIoScope(IoRouter([]), task_id)
    async with asyncio.timeout(30):
        return await engine.run_calls(task_id, snapshot, io, function, [list(args)])


def value_of(result: ConvergeTaskCalls) -> Any:
    assert isinstance(result, CallsConverged), result
    (output,) = result.outputs
    return json.loads(output.value_json)


async def test_every_import_form_gets_the_sibling_of_the_same_epoch(engine: CallEngine) -> None:
    first = build_snapshot(1, {"main": MAIN, "helpers": helpers(1)})
    second = build_snapshot(2, {"main": MAIN, "helpers": helpers(2)})
    assert value_of(await run(engine, first, "value")) == [1, 1, 1, 1]
    assert value_of(await run(engine, second, "value")) == [2, 2, 2, 2]
    # A task pinned to epoch 1 still sees epoch 1's helpers on the same executor.
    assert value_of(await run(engine, first, "value")) == [1, 1, 1, 1]
    assert value_of(await run(engine, second, "lazily")) == 42


async def test_modules_of_one_epoch_share_one_sibling_instance(engine: CallEngine) -> None:
    snapshot = build_snapshot(1, {"main": MAIN, "other": OTHER, "helpers": helpers(1)})
    assert value_of(await run(engine, snapshot, "note", "main")) == ["main"]
    assert value_of(await run(engine, snapshot, "other_note", "other")) == ["main", "other"]


async def test_an_import_cycle_loads_like_python(engine: CallEngine) -> None:
    snapshot = build_snapshot(
        1,
        {
            "ping": "import pong\n\ndef ping():\n    return pong.pong() + 1\n",
            "pong": (
                "import ping\n\ndef pong():\n    return 10\n\ndef via():\n    return ping.ping()\n"
            ),
        },
    )
    assert value_of(await run(engine, snapshot, "ping")) == 11
    assert value_of(await run(engine, snapshot, "via")) == 11


async def test_a_sibling_that_fails_to_load_fails_its_importer(engine: CallEngine) -> None:
    snapshot = build_snapshot(
        1, {"main": "import broken\n\ndef f():\n    return 1\n", "broken": "1 / 0\n"}
    )
    result = await run(engine, snapshot, "f")
    assert isinstance(result, CallsFailed)
    assert "COMPILE_ERROR: main.py failed while loading: ImportError" in result.failure_message
    assert "broken.py failed while loading: ZeroDivisionError" in result.failure_message


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("from . import nowhere\n", "ModuleNotFoundError: FUNCTIONS_DIR has no module nowhere.py"),
        ("from ..up import x\n", "FUNCTIONS_DIR is one flat package"),
    ],
)
async def test_imports_outside_the_directory_say_so(
    engine: CallEngine, source: str, words: str
) -> None:
    snapshot = build_snapshot(1, {"main": source + "\ndef f():\n    return 1\n"})
    result = await run(engine, snapshot, "f")
    assert isinstance(result, CallsFailed)
    assert words in result.failure_message
