"""The executor's own defences, in this process: the audit hook's new refusals,
its decisions on paths, and the check that its code is unchanged."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blockx_executor import runner as runner_module
from blockx_executor.integrity import ExecutorCodeChanged, IntegrityCheck, fail_and_stop
from blockx_executor.protocol import CallFailed, CallsCompleted, FrameDecoder, FromExecutor
from blockx_executor.runner import Runner
from blockx_executor.sandbox import CODE_WRITES, ReadRules, _hook


def _other_pid() -> int:
    return os.getppid()


@pytest.mark.parametrize(
    ("event", "args", "words"),
    [
        ("open", (f"/proc/{_other_pid()}/environ", "rb", 0), "read other processes' files"),
        ("open", (f"/proc/self/../{_other_pid()}/environ", "r", 0), "read other processes'"),
        ("open", (f"/proc/{_other_pid()}".encode(), "r", 0), "read other processes' files"),
        ("os.listdir", (f"/proc/{_other_pid()}/fd",), "read other processes' files"),
        ("import", ("_posixsubprocess", None, [], [], []), "import _posixsubprocess"),
        ("sqlite3.connect", ("/tmp/db.sqlite",), "use SQLite"),
        ("sqlite3.connect", ("",), "use SQLite"),
        # In memory too: it would ATTACH a file (the sink) or VACUUM INTO one.
        ("sqlite3.connect", (":memory:",), "use SQLite"),
        ("sqlite3.connect", ("file::memory:?cache=shared",), "use SQLite"),
        ("import", ("_posixshmem", None, [], [], []), "import _posixshmem"),
        ("open", ("/proc/self/environ", "rb", 0), "other users cannot read"),
        ("gc.get_referrers", (), "walk the executor's objects"),
        ("object.__setattr__", (Runner._complete, "__code__", None), "the executor's own code"),
        ("object.__setattr__", (Runner._fail, "__defaults__", ()), "the executor's own code"),
        ("object.__delattr__", (Runner._fail, "__defaults__"), "the executor's own code"),
    ],
)
def test_refused(event: str, args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(PermissionError, match=words):
        _hook(event, args)


def _mine() -> None:
    pass


@pytest.mark.parametrize(
    ("event", "args"),
    [
        ("open", ("/proc/self/statm", "rb", 0)),
        ("open", (f"/proc/{os.getpid()}/status", "r", 0)),
        ("open", ("/proc/meminfo", "r", 0)),
        ("open", (3, "r", 0)),
        ("os.listdir", ("/proc",)),
        ("open", (os.__file__, "r", 0)),  # the import path
        ("object.__setattr__", (_mine, "__code__", None)),  # a function's own functions
        ("object.__getattr__", (_mine, "__code__")),
    ],
)
def test_allowed(event: str, args: tuple[Any, ...]) -> None:
    _hook(event, args)


@pytest.fixture
def tree() -> Iterator[Path]:
    """Files with the modes a host has: world-readable ones, private ones, and
    readable ones in a directory others cannot search."""
    root = Path(tempfile.mkdtemp(prefix="blockx-paths-"))
    (root / "open").mkdir(mode=0o755)
    (root / "closed").mkdir(mode=0o700)
    (root / "code").mkdir(mode=0o700)
    for path, mode in [
        ("open/public", 0o644),
        ("open/private", 0o600),
        ("closed/public", 0o644),
        ("code/module.py", 0o600),
    ]:
        (root / path).write_text("x")
        (root / path).chmod(mode)
    os.symlink(root / "open" / "private", root / "open" / "link")
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


@pytest.fixture
def rules(tree: Path) -> ReadRules:
    return ReadRules(own_pid=os.getpid(), code_roots=[str(tree / "code")])


@pytest.mark.parametrize(
    ("event", "path", "refused"),
    [
        ("open", "open/public", None),
        ("open", "open/missing", None),  # the open fails by itself
        ("open", "open/private", "other users cannot read"),
        ("open", "open/link", "other users cannot read"),  # resolved first
        ("open", "open/../open/private", "other users cannot read"),
        ("open", "closed/public", "other users cannot read"),
        ("os.listdir", "closed", "other users cannot read"),
        ("os.scandir", "open", None),
        ("open", "code/module.py", None),  # the import path is code
    ],
)
def test_read_decisions(
    rules: ReadRules, tree: Path, event: str, path: str, refused: str | None
) -> None:
    why = rules.refusal(event, str(tree / path))
    assert why is None if refused is None else refused in (why or "")


def test_no_path_is_the_working_directory(
    rules: ReadRules, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree / "open")
    assert rules.refusal("os.listdir", None) is None
    assert rules.refusal("open", "public") is None
    monkeypatch.chdir(tree / "closed")
    assert "other users cannot read" in (rules.refusal("os.scandir", None) or "")
    assert "other users cannot read" in (rules.refusal("open", "public") or "")


@pytest.fixture
def proc_fd() -> Iterator[int]:
    fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_relative_path_is_decided_against_every_directory_held_open(
    rules: ReadRules, proc_fd: int
) -> None:
    """``os.open("<pid>/environ", dir_fd=<fd of /proc>)``: the ``open`` event does not
    carry the descriptor, so each directory the process holds open is tried."""
    relative = f"{_other_pid()}/environ"
    assert "read other processes' files" in (rules.refusal("open", relative) or "")
    assert "read other processes' files" in (rules.refusal("open", relative.encode()) or "")
    assert rules.refusal("open", "statm") is None  # /proc/statm: not a process's
    # os.listdir and os.scandir take no dir_fd: relative is the working directory.
    assert rules.refusal("os.listdir", str(_other_pid())) is None


@pytest.mark.parametrize("prefix", ["/dev/fd", "/proc/self/fd"])
def test_a_descriptor_path_is_resolved(rules: ReadRules, proc_fd: int, prefix: str) -> None:
    why = rules.refusal("open", f"{prefix}/{proc_fd}/{_other_pid()}/environ")
    assert "read other processes' files" in (why or "")
    assert rules.refusal("open", f"{prefix}/{proc_fd}/meminfo") is None


def test_a_listed_descriptor_is_resolved(rules: ReadRules, proc_fd: int) -> None:
    assert rules.refusal("os.listdir", proc_fd) is None  # /proc itself
    other = os.open(f"/proc/{_other_pid()}", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert "read other processes' files" in (rules.refusal("os.scandir", other) or "")
    finally:
        os.close(other)


def test_a_directory_whose_path_cannot_be_told_refuses_relative_reads(
    rules: ReadRules,
) -> None:
    gone = tempfile.mkdtemp(prefix="blockx-gone-")
    fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(gone)
        assert "cannot be told" in (rules.refusal("open", "x") or "")
        assert "cannot be told" in (rules.refusal("os.listdir", fd) or "")
        assert rules.refusal("open", "/etc/hostname") is None  # absolute: unaffected
    finally:
        os.close(fd)


@pytest.fixture
def runner() -> Iterator[tuple[Runner, socket.socket]]:
    ours, theirs = socket.socketpair()
    r = Runner(ours, "x-test", 1.0)
    r.integrity = IntegrityCheck.of(r)
    yield r, theirs
    ours.close()
    theirs.close()


def test_unchanged_code_passes(runner: tuple[Runner, socket.socket]) -> None:
    r, _ = runner
    assert r.integrity is not None
    assert r.integrity.changed() is None


def _forged(self: Runner, *args: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("target", "name", "named"),
    [
        (Runner, "_complete", "Runner._complete"),
        (runner_module, "describe", "blockx_executor.runner.describe"),
        (runner_module, "_FLUSH_EVERY_CALLS", "blockx_executor.runner._FLUSH_EVERY_CALLS"),
    ],
)
def test_a_rebinding_is_seen(
    runner: tuple[Runner, socket.socket],
    monkeypatch: pytest.MonkeyPatch,
    target: object,
    name: str,
    named: str,
) -> None:
    r, _ = runner
    assert r.integrity is not None
    monkeypatch.setattr(target, name, _forged)
    changed = r.integrity.changed()
    monkeypatch.undo()
    assert changed is not None
    assert "the call changed the executor's own code" in changed
    assert named in changed
    assert r.integrity.changed() is None


def test_a_changed_code_object_is_seen(runner: tuple[Runner, socket.socket]) -> None:
    r, _ = runner
    assert r.integrity is not None
    function = Runner._fail_budget
    saved = function.__code__
    function.__code__ = _forged.__code__
    try:
        changed = r.integrity.changed()
    finally:
        function.__code__ = saved
    assert changed is not None
    assert "Runner._fail_budget.__code__" in changed


def _disguise_and_replace_code(function: Any, code: Any, count: Iterator[int]) -> None:
    """What a call can do under the sandbox: the function no longer looks like the
    executor's, so the hook lets its code change through, and counts it."""
    function.__module__ = "user"
    next(count)  # the hook's step for the event of the assignment below
    function.__code__ = code


def test_a_counted_code_change_is_seen(runner: tuple[Runner, socket.socket]) -> None:
    """With the sandbox's count, the functions are compared when it moved, and a
    disguised change is seen; the check after it compares again (the count moved
    once more by its own reading) and the restored code passes."""
    r, _ = runner
    count = itertools.count()
    check = r.integrity = IntegrityCheck.of(r, count)
    assert check.changed() is None
    function = Runner._fail_budget
    module, saved = function.__module__, function.__code__
    try:
        _disguise_and_replace_code(function, _forged.__code__, count)
        changed = check.changed()
    finally:
        function.__module__ = module
        function.__code__ = saved
    assert changed is not None
    assert "Runner._fail_budget.__code__" in changed
    assert check.changed() is None


def test_the_hook_counts_every_code_change_it_sees() -> None:
    """Refused or let through, on any function, set or deleted: each advances the
    count the integrity check reads."""
    before = next(CODE_WRITES)
    _hook("object.__setattr__", (_mine, "__code__", _mine.__code__))
    _hook("object.__delattr__", (_mine, "__kwdefaults__"))
    with pytest.raises(PermissionError):
        _hook("object.__setattr__", (Runner._complete, "__defaults__", ()))
    _hook("object.__getattr__", (_mine, "__code__"))  # a read is not counted
    _hook("object.__setattr__", (_mine, "__name__", "other"))  # nor another attribute
    assert next(CODE_WRITES) == before + 4


def test_replacing_the_count_is_seen(
    runner: tuple[Runner, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockx_executor import sandbox

    r, _ = runner
    check = r.integrity = IntegrityCheck.of(r, CODE_WRITES)
    monkeypatch.setattr(sandbox, "CODE_WRITES", itertools.count())
    changed = check.changed()
    monkeypatch.undo()
    assert "blockx_executor.sandbox.CODE_WRITES" in (changed or "")


def test_instance_attributes_are_watched(runner: tuple[Runner, socket.socket]) -> None:
    r, _ = runner
    assert r.integrity is not None
    check = r.integrity
    r.__dict__["_complete"] = _forged  # shadows the method
    assert "the runner's _complete" in (check.changed() or "")
    del r.__dict__["_complete"]
    saved = r.__dict__["_json"]
    r.__dict__["_json"] = object()
    assert "the runner's _json" in (check.changed() or "")
    r.__dict__["_json"] = saved
    assert check.changed() is None


def test_fail_and_stop_fails_every_call_of_the_outbox() -> None:
    ours, theirs = socket.socketpair()
    try:
        outbox: list[Any] = [4, 5, CallFailed(6, "USER_ERROR", "x"), 4]
        with pytest.raises(ExecutorCodeChanged, match="changed"):
            fail_and_stop(ours, threading.Lock(), outbox, "the call changed it")
        decoder: FrameDecoder[FromExecutor] = FrameDecoder(FromExecutor)
        [messages] = [decoder.feed(theirs.recv(1 << 16))]
    finally:
        ours.close()
        theirs.close()
    assert [(m.call_id, m.kind, m.retryable) for m in messages if isinstance(m, CallFailed)] == [
        (4, "USER_ERROR", False),
        (5, "USER_ERROR", False),
        (6, "USER_ERROR", False),
    ]


class _EqualToEverything:
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


def test_a_replacement_that_claims_equality_is_seen(
    runner: tuple[Runner, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, _ = runner
    assert r.integrity is not None
    monkeypatch.setattr(runner_module, "_FLUSH_EVERY_NS", _EqualToEverything())
    changed = r.integrity.changed()
    monkeypatch.undo()
    assert changed is not None
    assert "_FLUSH_EVERY_NS" in changed


def test_a_change_fails_the_next_frame_that_carries_results(
    runner: tuple[Runner, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame with nothing in it is not sent, so not checked; the next one that
    carries a result is, and fails its calls."""
    r, theirs = runner
    monkeypatch.setattr(runner_module, "_FLUSH_EVERY_NS", _EqualToEverything())
    r._flush()  # nothing leaves
    theirs.setblocking(False)
    with pytest.raises(BlockingIOError):
        theirs.recv(1 << 16)
    r._complete(7, 14, 0, 0, 10**9)
    with pytest.raises(ExecutorCodeChanged, match="_FLUSH_EVERY_NS"):
        r._flush()
    monkeypatch.undo()
    decoder: FrameDecoder[FromExecutor] = FrameDecoder(FromExecutor)
    messages = decoder.feed(theirs.recv(1 << 16))
    assert [(m.call_id, m.kind) for m in messages if isinstance(m, CallFailed)] == [
        (7, "USER_ERROR")
    ]
    assert not [m for m in messages if isinstance(m, CallsCompleted)]
