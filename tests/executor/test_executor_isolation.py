"""The executor's own defences, in this process: the audit hook's new refusals and
the check that its code is unchanged."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from blockx_executor import runner as runner_module
from blockx_executor.integrity import ExecutorCodeChanged, IntegrityCheck, fail_and_stop
from blockx_executor.protocol import CallFailed, FrameDecoder, FromExecutor
from blockx_executor.runner import Runner
from blockx_executor.sandbox import _hook


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
        ("sqlite3.connect", ("/tmp/db.sqlite",), "SQLite database file"),
        ("sqlite3.connect", ("",), "SQLite database file"),
        ("gc.get_referrers", (), "walk the executor's objects"),
        ("object.__setattr__", (Runner._complete, "__code__", None), "the executor's own code"),
        ("object.__setattr__", (Runner._fail, "__defaults__", ()), "the executor's own code"),
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
        ("sqlite3.connect", (":memory:",)),
        ("sqlite3.connect", ("file::memory:?cache=shared",)),
        ("object.__setattr__", (_mine, "__code__", None)),  # a function's own functions
        ("object.__getattr__", (_mine, "__code__")),
    ],
)
def test_allowed(event: str, args: tuple[Any, ...]) -> None:
    _hook(event, args)


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
