"""DirectoryFunctionStore and CodeViewRefresher on real files in a temporary directory.

The refresher runs its real poll loop (a short interval) while the tests edit,
add, delete and break files; every wait is a poll on the view, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import FakeClock, wait_until

from blockx_core.code_view import CodeSnapshot, FunctionCodeView
from blockx_core.errors import InvalidConfig
from blockx_server.calls.functions import (
    CodeViewRefresher,
    DirectoryFunctionStore,
    FunctionStore,
    FunctionStoreError,
)
from blockx_server.runtime.clock import SYSTEM_CLOCK

POLL_MS = 10
RETENTION_MS = 60_000
HELLO_V1 = "def hello(name):\n    return f'hello {name}'\n"
HELLO_V2 = "def hello(name):\n    return f'hi {name}'\n"
ADD = "def add(a, b):\n    return a + b\n"


def write(directory: Path, name: str, text: str) -> None:
    """Write the way careful editors do: a temp file renamed over the target."""
    temp = directory / f".{name}.tmp"
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, directory / name)


def make_refresher(
    directory: Path, *, retention_ms: int = RETENTION_MS, clock: FakeClock | None = None
) -> CodeViewRefresher:
    return CodeViewRefresher(
        DirectoryFunctionStore(directory),
        FunctionCodeView(retention_ms=retention_ms),
        clock or FakeClock(),
        poll_interval_ms=POLL_MS,
    )


@contextlib.asynccontextmanager
async def running(refresher: CodeViewRefresher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(refresher.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def current_epoch(refresher: CodeViewRefresher) -> int:
    current = refresher.view.current
    return 0 if current is None else current.epoch


def source_of(snapshot: CodeSnapshot | None, function: str) -> str | None:
    assert snapshot is not None
    resolved = snapshot.resolve(function)
    return None if resolved is None else resolved.source


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "blockx_server.calls.functions" and r.levelno == logging.WARNING
    ]


# ---- DirectoryFunctionStore ----------------------------------------------------------------


async def test_directory_store_reads_python_files_directly_in_the_directory(
    tmp_path: Path,
) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    write(tmp_path, "math_utils.py", ADD)
    skipped = {
        ".hidden.py": "def hidden(): pass\n",
        "_private.py": "def private(): pass\n",
        ".#greet.py": "lock file\n",
        "greet.py~": "backup\n",
        "notes.txt": "not python\n",
        "greet.pyc": "bytecode\n",
    }
    for name, text in skipped.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "nested.py").write_text("def nested(): pass\n")
    (tmp_path / "looks_like.py").mkdir()  # a directory, not a module file

    store: FunctionStore = DirectoryFunctionStore(tmp_path)
    assert await store.load() == {"greet": HELLO_V1, "math_utils": ADD}


async def test_directory_store_of_an_empty_directory_is_an_empty_set(tmp_path: Path) -> None:
    assert await DirectoryFunctionStore(tmp_path).load() == {}


async def test_directory_store_decodes_like_python(tmp_path: Path) -> None:
    (tmp_path / "latin.py").write_bytes(
        "# -*- coding: latin-1 -*-\ndef cafe():\n    return 'café'\n".encode("latin-1")
    )
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfdef f():\n    return 1\n")
    (tmp_path / "crlf.py").write_bytes(b"def g():\r\n    return 2\r\n")
    sources = await DirectoryFunctionStore(tmp_path).load()
    assert "return 'café'" in sources["latin"]
    assert sources["bom"] == "def f():\n    return 1\n"
    assert sources["crlf"] == "def g():\n    return 2\n"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"x = '\xff\xfe'\n", "cannot decode"),
        (b"# coding: no-such-codec\nx = 1\n", "cannot decode"),
    ],
    ids=["invalid utf-8", "unknown coding"],
)
async def test_directory_store_undecodable_file_names_the_file(
    tmp_path: Path, raw: bytes, fragment: str
) -> None:
    (tmp_path / "broken_bytes.py").write_bytes(raw)
    with pytest.raises(FunctionStoreError, match=fragment) as caught:
        await DirectoryFunctionStore(tmp_path).load()
    assert "broken_bytes.py" in str(caught.value)


async def test_directory_store_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FunctionStoreError) as caught:
        await DirectoryFunctionStore(missing).load()
    assert str(missing) in str(caught.value)
    assert "does not exist" in str(caught.value)
    assert "FUNCTIONS_DIR" in str(caught.value)


async def test_directory_store_path_to_a_file_is_a_clear_error(tmp_path: Path) -> None:
    a_file = tmp_path / "functions.py"
    a_file.write_text(HELLO_V1)
    with pytest.raises(FunctionStoreError, match="is not a directory"):
        await DirectoryFunctionStore(a_file).load()


def test_directory_store_sees_whole_files_while_an_editor_replaces_them(tmp_path: Path) -> None:
    # Large versions make a torn read likely if reads were not one open file.
    versions = [f"def f():\n    return {i!r}\n" + f"# {'x' * 100}\n" * 2_000 for i in range(2)]
    write(tmp_path, "big.py", versions[0])
    store = DirectoryFunctionStore(tmp_path)
    stop = threading.Event()

    def editor() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            write(tmp_path, "big.py", versions[i % 2])

    thread = threading.Thread(target=editor)
    thread.start()
    try:
        seen = [asyncio.run(store.load()) for _ in range(200)]
    finally:
        stop.set()
        thread.join()
    for sources in seen:
        # Never a half-written file, never the editor's temp file.
        assert sources == {"big": sources["big"]}
        assert sources["big"] in versions


# ---- CodeViewRefresher ---------------------------------------------------------------------


async def test_refresh_once_publishes_then_reports_no_change(tmp_path: Path) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    first = await refresher.refresh_once()
    assert first is not None
    assert first.epoch == 1
    assert source_of(first, "hello") == HELLO_V1
    assert await refresher.refresh_once() is None
    assert await refresher.wait_first_snapshot() is first


class HeldFirstLoadStore:
    """A FunctionStore whose first load returns what was current when it started,
    but only once the test releases it: a slow read overtaken by a newer one."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.calls = 0
        self.release_first = asyncio.Event()

    async def load(self) -> dict[str, str]:
        self.calls += 1
        seen = dict(self.sources)
        if self.calls == 1:
            await self.release_first.wait()
        return seen


async def test_overlapping_refreshes_never_publish_an_older_load_last() -> None:
    store = HeldFirstLoadStore({"greet": HELLO_V1})
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    refresher = CodeViewRefresher(store, view, FakeClock(), poll_interval_ms=POLL_MS)
    slow = asyncio.create_task(refresher.refresh_once())
    await wait_until(lambda: store.calls == 1, "the first load to start")
    store.sources = {"greet": HELLO_V2}
    fast = asyncio.create_task(refresher.refresh_once())
    for _ in range(10):  # let the second refresh run as far as it can
        await asyncio.sleep(0)
    store.release_first.set()
    await asyncio.gather(slow, fast)
    # The newest sources are current, whatever order the loads finished in.
    assert source_of(view.current, "hello") == HELLO_V2
    assert view.epochs() == [1, 2]


async def test_edited_file_becomes_a_new_epoch_without_restart(tmp_path: Path) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    async with running(refresher):
        first = await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
        assert first.epoch == 1
        pinned = refresher.view.pin("task-before-edit", 0)

        write(tmp_path, "greet.py", HELLO_V2)
        await wait_until(lambda: current_epoch(refresher) == 2, "epoch 2 after the edit")

        assert source_of(refresher.view.current, "hello") == HELLO_V2
        # The task activated before the edit keeps running the old code.
        assert refresher.view.pinned("task-before-edit") is pinned
        assert source_of(pinned, "hello") == HELLO_V1


async def test_new_and_deleted_files_change_the_callable_functions(tmp_path: Path) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    async with running(refresher):
        await asyncio.wait_for(refresher.wait_first_snapshot(), 10)

        write(tmp_path, "math_utils.py", ADD)
        await wait_until(lambda: current_epoch(refresher) == 2, "epoch 2 after a new file")
        assert source_of(refresher.view.current, "add") == ADD
        assert source_of(refresher.view.current, "hello") == HELLO_V1

        (tmp_path / "greet.py").unlink()
        await wait_until(lambda: current_epoch(refresher) == 3, "epoch 3 after a deletion")
        current = refresher.view.current
        assert current is not None
        assert current.resolve("hello") is None
        assert set(current.modules) == {"math_utils"}
        assert "Did you mean" not in current.describe_missing("hello")


async def test_duplicate_function_across_files_keeps_the_previous_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "a.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    first = await refresher.refresh_once()
    assert first is not None

    write(tmp_path, "b.py", HELLO_V2)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        assert await refresher.refresh_once() is None
        # The same problem on the next poll is not logged again.
        assert await refresher.refresh_once() is None
    assert warnings_of(caplog) == [
        "function code not loaded, epoch 1 stays current: "
        "function 'hello' is defined in both a.py and b.py"
    ]
    assert refresher.view.current is first

    # Finishing the move (deleting the old definition) loads as the next epoch.
    (tmp_path / "a.py").unlink()
    second = await refresher.refresh_once()
    assert second is not None
    assert second.epoch == 2
    assert second.functions == {"hello": "b"}


async def test_duplicate_in_the_poll_loop_is_logged_and_then_resolved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "a.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        async with running(refresher):
            await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
            write(tmp_path, "b.py", HELLO_V2)
            await wait_until(lambda: bool(warnings_of(caplog)), "the duplicate warning")
            assert "both a.py and b.py" in warnings_of(caplog)[0]
            assert current_epoch(refresher) == 1

            write(tmp_path, "b.py", "def hello_b(name):\n    return name\n")
            await wait_until(lambda: current_epoch(refresher) == 2, "epoch 2 after the fix")
    assert len(warnings_of(caplog)) == 1


async def test_syntax_error_still_builds_a_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    write(tmp_path, "broken.py", "def compute(x:\n    return x\n")
    refresher = make_refresher(tmp_path)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        snapshot = await refresher.refresh_once()
    assert snapshot is not None
    assert source_of(snapshot, "hello") == HELLO_V1
    assert set(snapshot.parse_errors) == {"broken"}
    assert snapshot.parse_errors["broken"].startswith("SyntaxError at line 1:")
    assert "broken.py" in snapshot.describe_missing("compute")
    [warning] = warnings_of(caplog)
    assert "broken.py does not parse" in warning

    write(tmp_path, "broken.py", "def compute(x):\n    return x\n")
    fixed = await refresher.refresh_once()
    assert fixed is not None
    assert fixed.parse_errors == {}
    assert fixed.resolve("compute") is not None


async def test_bad_file_name_is_a_load_error_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "my-funcs.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        assert await refresher.refresh_once() is None
    [warning] = warnings_of(caplog)
    assert "no function code is loaded yet" in warning
    assert "my-funcs.py" in warning
    assert refresher.view.current is None


async def test_missing_directory_fails_refresh_and_run(tmp_path: Path) -> None:
    refresher = make_refresher(tmp_path / "absent")
    with pytest.raises(FunctionStoreError, match="does not exist"):
        await refresher.refresh_once()
    with pytest.raises(FunctionStoreError, match="does not exist"):
        await asyncio.wait_for(refresher.run(), 10)
    assert refresher.view.current is None


async def test_directory_vanishing_later_keeps_serving_the_current_epoch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    functions_dir = tmp_path / "functions"
    functions_dir.mkdir()
    write(functions_dir, "greet.py", HELLO_V1)
    refresher = make_refresher(functions_dir)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        async with running(refresher) as task:
            await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
            shutil.rmtree(functions_dir)
            await wait_until(lambda: bool(warnings_of(caplog)), "the missing-directory warning")
            assert "epoch 1 stays current" in warnings_of(caplog)[0]
            assert "does not exist" in warnings_of(caplog)[0]
            assert not task.done()

            functions_dir.mkdir()
            write(functions_dir, "greet.py", HELLO_V2)
            await wait_until(lambda: current_epoch(refresher) == 2, "epoch 2 after recovery")


async def test_wait_first_snapshot_waits_for_loadable_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, "a.py", HELLO_V1)
    write(tmp_path, "b.py", HELLO_V1)
    refresher = make_refresher(tmp_path)
    with caplog.at_level(logging.WARNING, logger="blockx_server.calls.functions"):
        async with running(refresher):
            waiter = asyncio.create_task(refresher.wait_first_snapshot())
            # A poll has run and refused the set: the duplicate blocks the first load.
            await wait_until(lambda: bool(warnings_of(caplog)), "the duplicate warning")
            assert not waiter.done()
            assert refresher.view.current is None
            (tmp_path / "b.py").unlink()
            first = await asyncio.wait_for(waiter, 10)
    assert first.epoch == 1
    assert first.functions == {"hello": "a"}


async def test_run_collects_superseded_snapshots(tmp_path: Path) -> None:
    clock = FakeClock()
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = make_refresher(tmp_path, retention_ms=1_000, clock=clock)
    async with running(refresher):
        await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
        refresher.view.pin("task-1", clock.now_ms())
        write(tmp_path, "greet.py", HELLO_V2)
        await wait_until(lambda: current_epoch(refresher) == 2, "epoch 2")

        # Unpinned and past retention: the next poll drops epoch 1.
        refresher.view.unpin("task-1", clock.now_ms())
        clock.advance(999)
        assert refresher.view.next_collect_ms() == clock.now_ms() + 1
        clock.advance(1)
        await wait_until(lambda: refresher.view.epochs() == [2], "epoch 1 collected")


async def test_unpin_then_rearm_collects_at_once_without_a_poll(tmp_path: Path) -> None:
    clock = FakeClock()
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = CodeViewRefresher(
        DirectoryFunctionStore(tmp_path),
        FunctionCodeView(retention_ms=1_000),
        clock,
        poll_interval_ms=3_600_000,  # no poll comes during the test
    )
    async with running(refresher):
        await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
        refresher.view.pin("task-1", clock.now_ms())
        write(tmp_path, "greet.py", HELLO_V2)
        assert await refresher.refresh_once() is not None
        clock.advance(1_000)
        refresher.rearm_collection()
        assert refresher.view.epochs() == [1, 2]  # still pinned
        refresher.view.unpin("task-1", clock.now_ms())
        refresher.rearm_collection()  # what the Orchestrator does when a task converges
        assert refresher.view.epochs() == [2]


async def test_collection_timer_fires_at_the_drop_time_without_a_poll(tmp_path: Path) -> None:
    write(tmp_path, "greet.py", HELLO_V1)
    refresher = CodeViewRefresher(
        DirectoryFunctionStore(tmp_path),
        FunctionCodeView(retention_ms=50),
        SYSTEM_CLOCK,
        poll_interval_ms=3_600_000,  # no poll comes during the test
    )
    async with running(refresher):
        await asyncio.wait_for(refresher.wait_first_snapshot(), 10)
        write(tmp_path, "greet.py", HELLO_V2)
        assert await refresher.refresh_once() is not None
        assert refresher.view.epochs() == [1, 2]
        # Epoch 1 is unpinned: the timer armed at publish drops it after 50 ms.
        await wait_until(lambda: refresher.view.epochs() == [2], "epoch 1 collected")


def test_refresher_refuses_a_non_positive_poll_interval(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="poll_interval_ms"):
        CodeViewRefresher(
            DirectoryFunctionStore(tmp_path),
            FunctionCodeView(retention_ms=0),
            FakeClock(),
            poll_interval_ms=0,
        )
