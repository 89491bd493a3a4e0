"""Function Code View: parsing modules, building snapshots, and the epoch store.

The store tests move ``now_ms`` by hand; nothing here sleeps. The property test
at the end drives FunctionCodeView through random interleavings of publish,
pin, unpin and collect against a small model of which epochs must survive.
"""

from __future__ import annotations

import hashlib
from textwrap import dedent
from types import MappingProxyType

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockx_core.code_view import (
    CodeLoadError,
    CodeSnapshot,
    FunctionCodeView,
    FunctionSource,
    NoSnapshotError,
    build_snapshot,
    top_level_functions,
)
from blockx_core.errors import InvalidConfig

T0 = 1_700_000_000_000
RETENTION_MS = 60_000

HELLO_V1 = "def hello(name):\n    return f'hello {name}'\n"
HELLO_V2 = "def hello(name):\n    return f'hi {name}'\n"


def src(text: str) -> str:
    return dedent(text).lstrip("\n")


# ---- top_level_functions --------------------------------------------------------------

TOP_LEVEL_CASES = [
    # (id, source, expected names)
    ("def", "def f(): pass\n", ["f"]),
    ("async def", "async def f(): pass\n", ["f"]),
    ("source order", "def b(): pass\ndef a(): pass\n", ["b", "a"]),
    (
        "nested excluded",
        src("""
            def outer():
                def inner():
                    pass
                return inner
        """),
        ["outer"],
    ),
    (
        "methods excluded",
        src("""
            class C:
                def method(self):
                    pass
                async def amethod(self):
                    pass
            def f(): pass
        """),
        ["f"],
    ),
    ("private excluded", "def _helper(): pass\ndef __dunder__(): pass\ndef f(): pass\n", ["f"]),
    (
        "decorators fine",
        src("""
            import functools
            @functools.lru_cache(maxsize=None)
            def cached(x):
                return x
            @staticmethod
            async def decorated_async():
                pass
        """),
        ["cached", "decorated_async"],
    ),
    (
        "redefinition counts once",
        "def f(): return 1\ndef g(): pass\ndef f(): return 2\n",
        ["f", "g"],
    ),
    (
        "only direct module body",
        src("""
            if True:
                def conditional(): pass
            try:
                def in_try(): pass
            except Exception:
                pass
        """),
        [],
    ),
    ("assignments are not defs", "f = lambda: 1\nfrom os import path\n", []),
    ("empty module", "", []),
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param(source, expected, id=case_id) for case_id, source, expected in TOP_LEVEL_CASES],
)
def test_top_level_functions(source: str, expected: list[str]) -> None:
    assert top_level_functions(source) == expected


@pytest.mark.parametrize(
    "source",
    ["def f(:\n    pass\n", "def f():\nreturn 1\n", "x = (\n", "a\x00b\n", "-" * 200_000 + "x"],
    ids=["bad signature", "bad indent", "unclosed", "nul byte", "too deep"],
)
def test_top_level_functions_raises_syntax_error(source: str) -> None:
    with pytest.raises(SyntaxError):
        top_level_functions(source)


# ---- build_snapshot ---------------------------------------------------------------------


def test_build_snapshot_resolves_functions_to_their_module() -> None:
    snapshot = build_snapshot(
        7,
        {
            "greet": HELLO_V1 + "async def bye(): pass\ndef _helper(): pass\n",
            "math_utils": "def add(a, b):\n    return a + b\n",
        },
    )
    assert snapshot.epoch == 7
    assert snapshot.functions == {"add": "math_utils", "bye": "greet", "hello": "greet"}
    assert snapshot.parse_errors == {}
    hello = snapshot.resolve("hello")
    assert hello is not None
    assert hello.module == "greet"
    assert hello.source.startswith(HELLO_V1)
    assert hello.digest == hashlib.sha256(hello.source.encode()).hexdigest()
    assert snapshot.resolve("add") == snapshot.modules["math_utils"]
    assert snapshot.resolve("_helper") is None
    assert snapshot.resolve("missing") is None


def test_private_helpers_may_share_a_name_across_modules() -> None:
    snapshot = build_snapshot(
        1,
        {
            "a": "def _helper(): return 1\ndef fa(): return _helper()\n",
            "b": "def _helper(): return 2\ndef fb(): return _helper()\n",
        },
    )
    assert snapshot.functions == {"fa": "a", "fb": "b"}


LOAD_ERROR_CASES = [
    # (id, sources, fragments the message must contain)
    (
        "duplicate across two modules",
        {"a": "def hello(): pass\n", "b": "async def hello(): pass\n"},
        ["function 'hello' is defined in both a.py and b.py"],
    ),
    (
        "duplicate across three modules",
        {"a": "def f(): pass\n", "b": "def f(): pass\n", "c": "def f(): pass\n"},
        ["function 'f' is defined in a.py, b.py and c.py"],
    ),
    (
        "every duplicate is reported",
        {"a": "def f(): pass\ndef g(): pass\n", "b": "def f(): pass\ndef g(): pass\n"},
        ["'f' is defined in both a.py and b.py", "'g' is defined in both a.py and b.py"],
    ),
    (
        "hyphen in the file name",
        {"my-funcs": "def f(): pass\n"},
        ["my-funcs.py", "not a valid Python identifier", "my_funcs.py"],
    ),
    ("leading digit", {"1st": "def f(): pass\n"}, ["1st.py", "not a valid Python identifier"]),
    ("keyword", {"class": "def f(): pass\n"}, ["class.py", "keyword"]),
    ("dotted stem", {"a.b": "def f(): pass\n"}, ["a.b.py", "not a valid Python identifier"]),
    ("not encodable as UTF-8", {"lone": "x = '\ud800'\n"}, ["lone.py", "UTF-8"]),
]


@pytest.mark.parametrize(
    ("sources", "fragments"),
    [
        pytest.param(sources, fragments, id=case_id)
        for case_id, sources, fragments in LOAD_ERROR_CASES
    ],
)
def test_build_snapshot_load_errors(sources: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(CodeLoadError) as caught:
        build_snapshot(1, sources)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message
    assert isinstance(caught.value, ValueError)


def test_every_duplicate_is_a_separate_problem() -> None:
    sources = {"a": "def f(): pass\ndef g(): pass\n", "b": "def f(): pass\ndef g(): pass\n"}
    with pytest.raises(CodeLoadError) as caught:
        build_snapshot(1, sources)
    assert caught.value.problems == (
        "function 'f' is defined in both a.py and b.py",
        "function 'g' is defined in both a.py and b.py",
    )


PARSE_ERROR_CASES = [
    # (id, broken source, the one-line description)
    ("invalid syntax", "def ok(): pass\n\nx = = 1\n", "SyntaxError at line 3: invalid syntax"),
    (
        "indentation",
        "def f():\nreturn 1\n",
        "IndentationError at line 2: "
        "expected an indented block after function definition on line 1",
    ),
    ("unclosed bracket", "x = [1,\n", "SyntaxError at line 1: '[' was never closed"),
    # Only the compiler sees these: ast.parse accepts them.
    ("return outside function", "return 1\n", "SyntaxError at line 1: 'return' outside function"),
    ("await at top level", "await f()\n", "SyntaxError at line 1: 'await' outside function"),
    ("too deep", "-" * 200_000 + "x\n", "SyntaxError: source is nested too deeply to parse"),
]


@pytest.mark.parametrize(
    ("broken", "description"),
    [pytest.param(broken, desc, id=case_id) for case_id, broken, desc in PARSE_ERROR_CASES],
)
def test_parse_errors_are_isolated_per_module(broken: str, description: str) -> None:
    snapshot = build_snapshot(1, {"good": HELLO_V1, "broken": broken})
    assert snapshot.parse_errors == {"broken": description}
    assert "\n" not in description
    # The good module keeps working; the broken one keeps its source (and digest).
    assert snapshot.functions == {"hello": "good"}
    assert snapshot.modules["broken"].source == broken


def test_a_broken_module_does_not_count_towards_duplicates() -> None:
    snapshot = build_snapshot(1, {"a": HELLO_V1, "b": HELLO_V1 + "x = = 1\n"})
    assert snapshot.functions == {"hello": "a"}
    assert set(snapshot.parse_errors) == {"b"}


MISSING_CASES = [
    # (id, sources, function asked for, fragments expected, fragments not expected)
    (
        "close match",
        {"greet": HELLO_V1 + "def help_me(): pass\n"},
        "helo",
        ["'helo' is not defined", "epoch 1", "Did you mean 'hello'"],
        ["failed to parse"],
    ),
    (
        "no close match",
        {"greet": HELLO_V1},
        "zzz",
        ["'zzz' is not defined"],
        ["Did you mean", "failed to parse"],
    ),
    (
        "parse error may hide it",
        {"greet": HELLO_V1, "broken": "def compute(:\n"},
        "compute",
        ["'compute' is not defined", "broken.py (SyntaxError at line 1:", "failed to parse"],
        ["Did you mean"],
    ),
    (
        "private name",
        {"greet": HELLO_V1 + "def _secret(): pass\n"},
        "_secret",
        ["private helpers"],
        [],
    ),
    ("nothing loaded", {}, "hello", ["No callable functions are loaded"], ["Did you mean"]),
]


@pytest.mark.parametrize(
    ("sources", "function", "present", "absent"),
    [pytest.param(*case[1:], id=case[0]) for case in MISSING_CASES],
)
def test_describe_missing(
    sources: dict[str, str], function: str, present: list[str], absent: list[str]
) -> None:
    snapshot = build_snapshot(1, sources)
    assert snapshot.resolve(function) is None
    message = snapshot.describe_missing(function)
    for fragment in present:
        assert fragment in message
    for fragment in absent:
        assert fragment not in message


def test_describe_missing_offers_several_close_names() -> None:
    snapshot = build_snapshot(1, {"m": "def get_block(): pass\ndef get_blocks(): pass\n"})
    message = snapshot.describe_missing("get_blok")
    assert "'get_block'" in message
    assert "'get_blocks'" in message


def test_digest_is_stable_and_order_independent() -> None:
    sources = {"a": HELLO_V1, "b": "def add(a, b): return a + b\n", "c": "x = = 1\n"}
    forward = build_snapshot(1, sources)
    backward = build_snapshot(9, dict(reversed(list(sources.items()))))
    assert forward.digest == backward.digest
    assert len(forward.digest) == 64
    int(forward.digest, 16)


DIGEST_CHANGES = [
    # (id, sources that must digest differently from BASE)
    ("source edited", {"a": HELLO_V2, "b": "def add(): pass\n"}),
    ("module added", {"a": HELLO_V1, "b": "def add(): pass\n", "c": ""}),
    ("module removed", {"a": HELLO_V1}),
    ("module renamed", {"a2": HELLO_V1, "b": "def add(): pass\n"}),
    ("sources swapped", {"a": "def add(): pass\n", "b": HELLO_V1}),
    ("empty set", {}),
]
BASE = {"a": HELLO_V1, "b": "def add(): pass\n"}


@pytest.mark.parametrize(
    "changed", [pytest.param(changed, id=case_id) for case_id, changed in DIGEST_CHANGES]
)
def test_digest_changes_with_the_source_set(changed: dict[str, str]) -> None:
    assert build_snapshot(1, changed).digest != build_snapshot(1, BASE).digest


def test_snapshot_is_a_msgspec_value() -> None:
    snapshot = build_snapshot(1, {"a": HELLO_V1})
    again = build_snapshot(1, {"a": HELLO_V1})
    _ = snapshot.digest  # a cached digest takes no part in equality
    assert snapshot == again
    assert isinstance(snapshot.modules["a"], FunctionSource)
    assert isinstance(snapshot, CodeSnapshot)


# ---- FunctionCodeView -------------------------------------------------------------------


def test_epochs_increase_by_one_per_real_change() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    assert view.epochs() == []
    first = view.publish({"greet": HELLO_V1}, T0)
    assert first is not None
    assert first.epoch == 1
    assert view.publish({"greet": HELLO_V1}, T0 + 1) is None
    assert view.publish(MappingProxyType({"greet": HELLO_V1}), T0 + 2) is None
    second = view.publish({"greet": HELLO_V2}, T0 + 3)
    assert second is not None
    assert second.epoch == 2
    third = view.publish({"greet": HELLO_V2, "extra": "def extra(): pass\n"}, T0 + 4)
    assert third is not None
    assert third.epoch == 3
    # Going back to older sources is a change too: epochs never go back.
    fourth = view.publish({"greet": HELLO_V1}, T0 + 5)
    assert fourth is not None
    assert fourth.epoch == 4
    assert view.current is fourth
    assert view.epochs() == [1, 2, 3, 4]


def test_publishing_a_fix_for_a_parse_error_is_a_new_epoch() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    broken = view.publish({"greet": "def hello(:\n"}, T0)
    assert broken is not None
    assert set(broken.parse_errors) == {"greet"}
    fixed = view.publish({"greet": HELLO_V1}, T0 + 1)
    assert fixed is not None
    assert fixed.epoch == 2
    assert fixed.resolve("hello") is not None


def test_load_error_keeps_the_current_snapshot_and_uses_no_epoch() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    first = view.publish({"a": HELLO_V1}, T0)
    with pytest.raises(CodeLoadError, match=r"both a\.py and b\.py"):
        view.publish({"a": HELLO_V1, "b": HELLO_V2}, T0 + 1)
    assert view.current is first
    second = view.publish({"b": HELLO_V2}, T0 + 2)
    assert second is not None
    assert second.epoch == 2


def test_load_error_on_the_first_publish_leaves_the_view_empty() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    with pytest.raises(CodeLoadError):
        view.publish({"bad-name": HELLO_V1}, T0)
    assert view.current is None
    assert view.epochs() == []


def test_pin_keeps_a_task_on_its_epoch_after_a_newer_publish() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    first = view.publish({"greet": HELLO_V1}, T0)
    pinned = view.pin("task-1", T0 + 1)
    assert pinned is first
    assert view.pinned("task-1") is first

    view.publish({"greet": HELLO_V2}, T0 + 2)
    later = view.pin("task-2", T0 + 3)
    assert later.epoch == 2

    # task-1 still runs epoch 1's code; task-2 runs epoch 2's.
    old_snapshot = view.pinned("task-1")
    assert old_snapshot is not None
    resolved = old_snapshot.resolve("hello")
    assert resolved is not None
    assert resolved.source == HELLO_V1
    new_snapshot = view.pinned("task-2")
    assert new_snapshot is not None
    resolved_new = new_snapshot.resolve("hello")
    assert resolved_new is not None
    assert resolved_new.source == HELLO_V2


def test_pinning_the_same_task_twice_returns_its_existing_pin() -> None:
    view = FunctionCodeView(retention_ms=0)
    view.publish({"greet": HELLO_V1}, T0)
    view.pin("task-1", T0)
    view.publish({"greet": HELLO_V2}, T0 + 1)
    again = view.pin("task-1", T0 + 2)
    assert again.epoch == 1
    # One unpin releases it: the second pin did not count twice.
    view.unpin("task-1", T0 + 3)
    assert view.collect(T0 + 3) == [1]


def test_pin_before_any_publish_is_a_clear_error() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    with pytest.raises(NoSnapshotError, match=r"task 't1'.*no code has been published"):
        view.pin("t1", T0)
    assert view.pinned("t1") is None


def test_unpin_is_idempotent() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    view.publish({"greet": HELLO_V1}, T0)
    view.pin("t1", T0)
    view.unpin("t1", T0 + 1)
    view.unpin("t1", T0 + 2)
    view.unpin("never-pinned", T0 + 3)
    assert view.pinned("t1") is None


def test_collect_keeps_pinned_and_recent_snapshots_and_drops_the_rest() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    view.publish({"m": "def v1(): pass\n"}, T0)
    view.pin("on-epoch-1", T0)
    view.publish({"m": "def v2(): pass\n"}, T0 + 1_000)  # epoch 1 superseded at T0 + 1 s
    view.publish({"m": "def v3(): pass\n"}, T0 + 2_000)  # epoch 2 superseded at T0 + 2 s
    assert view.next_collect_ms() == T0 + 2_000 + RETENTION_MS

    # Within retention nothing goes, pinned or not.
    assert view.collect(T0 + 2_000 + RETENTION_MS - 1) == []
    assert view.epochs() == [1, 2, 3]

    # Epoch 2 (unpinned) goes once its retention passed; epoch 1 is pinned.
    assert view.collect(T0 + 2_000 + RETENTION_MS) == [2]
    assert view.epochs() == [1, 3]
    assert view.snapshot(2) is None
    assert view.next_collect_ms() is None

    # Unpinning an epoch superseded long ago makes it collectable at once.
    view.unpin("on-epoch-1", T0 + 10 * RETENTION_MS)
    assert view.next_collect_ms() == T0 + 1_000 + RETENTION_MS
    assert view.collect(T0 + 10 * RETENTION_MS) == [1]

    # The current snapshot is never dropped, however old.
    assert view.collect(T0 + 1_000 * RETENTION_MS) == []
    assert view.epochs() == [3]
    current = view.snapshot(3)
    assert current is not None
    assert current is view.current


def test_unpinned_epoch_waits_out_its_retention_even_after_unpin() -> None:
    view = FunctionCodeView(retention_ms=RETENTION_MS)
    view.publish({"m": "def v1(): pass\n"}, T0)
    view.pin("t", T0)
    view.publish({"m": "def v2(): pass\n"}, T0 + 100)
    view.unpin("t", T0 + 200)
    # Retention counts from supersession, not from the unpin.
    assert view.next_collect_ms() == T0 + 100 + RETENTION_MS
    assert view.collect(T0 + 99 + RETENTION_MS) == []
    assert view.collect(T0 + 100 + RETENTION_MS) == [1]


def test_negative_retention_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="retention_ms"):
        FunctionCodeView(retention_ms=-1)


# ---- property: any interleaving keeps pinned and current epochs --------------------------

TASKS = ["t1", "t2", "t3", "t4"]
# Few distinct sources so that unchanged publishes happen, plus one duplicate-name set.
SOURCE_SETS: list[dict[str, str]] = [
    {"a": "def f(): return 1\n"},
    {"a": "def f(): return 2\n"},
    {"a": "def f(): return 1\n", "b": "def g(): pass\n"},
    {"b": "def g(:\n"},
    {},
    {"a": "def f(): pass\n", "b": "def f(): pass\n"},  # CodeLoadError
]
PROPERTY_RETENTION_MS = 50


class CodeViewMachine(RuleBasedStateMachine):
    """Model: the pins and supersession times, from which survivors follow."""

    def __init__(self) -> None:
        super().__init__()
        self.view = FunctionCodeView(retention_ms=PROPERTY_RETENTION_MS)
        self.now = T0
        self.last_epoch = 0
        self.pins: dict[str, CodeSnapshot] = {}
        self.superseded_at: dict[int, int] = {}
        self.dropped: set[int] = set()

    @initialize()
    def first_publish(self) -> None:
        assert self.view.publish(SOURCE_SETS[0], self.now) is not None
        self.last_epoch = 1

    @rule(ms=st.integers(min_value=0, max_value=40))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(index=st.integers(min_value=0, max_value=len(SOURCE_SETS) - 1))
    def publish(self, index: int) -> None:
        before = self.view.current
        assert before is not None
        try:
            snapshot = self.view.publish(SOURCE_SETS[index], self.now)
        except CodeLoadError:
            assert self.view.current is before
            return
        if snapshot is None:
            assert build_snapshot(0, SOURCE_SETS[index]).digest == before.digest
            assert self.view.current is before
            return
        assert snapshot.epoch == self.last_epoch + 1
        self.superseded_at[before.epoch] = self.now
        self.last_epoch = snapshot.epoch

    @rule(task=st.sampled_from(TASKS))
    def pin(self, task: str) -> None:
        snapshot = self.view.pin(task, self.now)
        if task in self.pins:
            assert snapshot is self.pins[task]
        else:
            assert snapshot is self.view.current
            self.pins[task] = snapshot

    @rule(task=st.sampled_from(TASKS))
    def unpin(self, task: str) -> None:
        self.view.unpin(task, self.now)
        self.pins.pop(task, None)

    @rule()
    def collect(self) -> None:
        due = self.view.next_collect_ms()
        dropped = self.view.collect(self.now)
        pinned = {s.epoch for s in self.pins.values()}
        expected = sorted(
            epoch
            for epoch, at in self.superseded_at.items()
            if epoch not in self.dropped
            and epoch not in pinned
            and self.now - at >= PROPERTY_RETENTION_MS
        )
        assert sorted(dropped) == expected
        # The timer agrees with collect: due now or earlier exactly when it dropped.
        assert (due is not None and due <= self.now) == bool(dropped)
        self.dropped.update(dropped)

    @invariant()
    def pinned_and_current_survive(self) -> None:
        current = self.view.current
        assert current is not None
        assert current.epoch == self.last_epoch
        assert self.view.snapshot(current.epoch) is current
        for task, snapshot in self.pins.items():
            assert self.view.pinned(task) is snapshot
            assert self.view.snapshot(snapshot.epoch) is snapshot

    @invariant()
    def epochs_strictly_increase(self) -> None:
        epochs = self.view.epochs()
        assert epochs == sorted(set(epochs))
        assert epochs[-1] == self.last_epoch
        assert not set(epochs) & self.dropped


CodeViewMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
TestCodeViewProperty = CodeViewMachine.TestCase
