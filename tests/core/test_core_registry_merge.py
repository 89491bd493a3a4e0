"""RegistryMerge: one worker view merged by workerAddr over several registry prefixes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_core.heartbeat import WorkerHeartbeat
from blockx_core.registry import InvalidRegistryPrefix, RegistryFormat
from blockx_core.registry_merge import (
    MergeChange,
    RegistryMerge,
    WorkerRemoved,
    WorkerUpserted,
)

# Legacy bundle sorts before both v2 prefixes ('b' < 'p' < 't'), so a tie between
# legacy and v2 that v2 wins is decided by format, not by the string order.
LB = "/blockx/bundle-workers/"
LW = "/blockx/workers/"
PROD = "/blockx/prod/lanes/default/bundle-workers/"
TEST = "/blockx/test/lanes/default/bundle-workers/"


def hb(addr: str, last: int, slots: int = 1) -> WorkerHeartbeat:
    """``slots`` tells apart heartbeats with the same address and time."""
    return WorkerHeartbeat(worker_addr=addr, task_slots=slots, last_heartbeat_ms=last)


def up(addr: str, last: int, slots: int = 1) -> WorkerUpserted:
    return WorkerUpserted(hb(addr, last, slots))


def rm(addr: str) -> WorkerRemoved:
    return WorkerRemoved(addr)


@dataclass(frozen=True)
class Put:
    prefix: str
    heartbeat: WorkerHeartbeat


@dataclass(frozen=True)
class Delete:
    prefix: str
    addr: str


@dataclass(frozen=True)
class Replace:
    prefix: str
    heartbeats: tuple[WorkerHeartbeat, ...]


Op = Put | Delete | Replace
# The expected return of an op: put/delete give one change or None, replace a list.
Expected = MergeChange | None | list[MergeChange]


def _apply(merge: RegistryMerge, op: Op) -> Expected:
    if isinstance(op, Put):
        return merge.put(op.prefix, op.heartbeat)
    if isinstance(op, Delete):
        return merge.delete(op.prefix, op.addr)
    return merge.replace_prefix(op.prefix, op.heartbeats)


# (id, prefixes, [(op, expected change(s))], merged view at the end)
SCENARIOS: list[tuple[str, list[str], list[tuple[Op, Expected]], list[WorkerHeartbeat]]] = [
    (
        "put-new-worker-upserts",
        [PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10))],
        [hb("a", 10)],
    ),
    (
        "identical-put-is-no-change",
        [PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10)), (Put(PROD, hb("a", 10)), None)],
        [hb("a", 10)],
    ),
    (
        "changed-put-same-prefix-upserts-even-if-older",
        [PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10)), (Put(PROD, hb("a", 5)), up("a", 5))],
        [hb("a", 5)],
    ),
    (
        "same-time-different-fields-upserts",
        [PROD],
        [(Put(PROD, hb("a", 10, 1)), up("a", 10, 1)), (Put(PROD, hb("a", 10, 2)), up("a", 10, 2))],
        [hb("a", 10, 2)],
    ),
    (
        "delete-only-entry-removes",
        [PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10)), (Delete(PROD, "a"), rm("a"))],
        [],
    ),
    (
        "delete-unknown-is-no-change",
        [PROD, LB],
        [(Delete(PROD, "a"), None), (Put(LB, hb("a", 1)), up("a", 1)), (Delete(PROD, "a"), None)],
        [hb("a", 1)],
    ),
    (
        "delete-twice-second-is-no-change",
        [PROD],
        [
            (Put(PROD, hb("a", 1)), up("a", 1)),
            (Delete(PROD, "a"), rm("a")),
            (Delete(PROD, "a"), None),
        ],
        [],
    ),
    (
        "newer-heartbeat-wins-across-prefixes",
        [LB, PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10)), (Put(LB, hb("a", 11, 2)), up("a", 11, 2))],
        [hb("a", 11, 2)],
    ),
    (
        "older-heartbeat-under-other-prefix-loses",
        [LB, PROD],
        [(Put(LB, hb("a", 10)), up("a", 10)), (Put(PROD, hb("a", 9, 2)), None)],
        [hb("a", 10)],
    ),
    (
        "newer-legacy-beats-v2",
        [LB, PROD],
        [(Put(PROD, hb("a", 10)), up("a", 10)), (Put(LB, hb("a", 20, 3)), up("a", 20, 3))],
        [hb("a", 20, 3)],
    ),
    (
        "tie-v2-beats-legacy-v2-first",
        [LB, PROD],
        [(Put(PROD, hb("a", 10, 1)), up("a", 10, 1)), (Put(LB, hb("a", 10, 2)), None)],
        [hb("a", 10, 1)],
    ),
    (
        "tie-v2-beats-legacy-legacy-first",
        [LB, PROD],
        [(Put(LB, hb("a", 10, 2)), up("a", 10, 2)), (Put(PROD, hb("a", 10, 1)), up("a", 10, 1))],
        [hb("a", 10, 1)],
    ),
    (
        "tie-v2-beats-legacy-prefix-order-reversed",
        [PROD, LB],
        [(Put(LB, hb("a", 10, 2)), up("a", 10, 2)), (Put(PROD, hb("a", 10, 1)), up("a", 10, 1))],
        [hb("a", 10, 1)],
    ),
    (
        "tie-two-v2-smaller-prefix-wins",
        [TEST, PROD],
        [(Put(TEST, hb("a", 10, 2)), up("a", 10, 2)), (Put(PROD, hb("a", 10, 1)), up("a", 10, 1))],
        [hb("a", 10, 1)],
    ),
    (
        "tie-two-v2-larger-prefix-loses",
        [PROD, TEST],
        [(Put(PROD, hb("a", 10, 1)), up("a", 10, 1)), (Put(TEST, hb("a", 10, 2)), None)],
        [hb("a", 10, 1)],
    ),
    (
        "tie-two-legacy-smaller-prefix-wins",
        [LW, LB],
        [(Put(LW, hb("a", 10, 2)), up("a", 10, 2)), (Put(LB, hb("a", 10, 1)), up("a", 10, 1))],
        [hb("a", 10, 1)],
    ),
    (
        "tie-three-prefixes-v2-then-smaller",
        [LB, TEST, PROD],
        [
            (Put(LB, hb("a", 10, 1)), up("a", 10, 1)),
            (Put(TEST, hb("a", 10, 2)), up("a", 10, 2)),
            (Put(PROD, hb("a", 10, 3)), up("a", 10, 3)),
            (Delete(PROD, "a"), up("a", 10, 2)),
            (Delete(TEST, "a"), up("a", 10, 1)),
            (Delete(LB, "a"), rm("a")),
        ],
        [],
    ),
    (
        "survives-until-gone-under-every-prefix",
        [LB, PROD],
        [
            (Put(LB, hb("a", 10)), up("a", 10)),
            (Put(PROD, hb("a", 12, 2)), up("a", 12, 2)),
            # The winner goes: the survivor's heartbeat is published again.
            (Delete(PROD, "a"), up("a", 10)),
            (Delete(LB, "a"), rm("a")),
        ],
        [],
    ),
    (
        "deleting-the-loser-changes-nothing",
        [LB, PROD],
        [
            (Put(LB, hb("a", 10)), up("a", 10)),
            (Put(PROD, hb("a", 12, 2)), up("a", 12, 2)),
            (Delete(LB, "a"), None),
            (Delete(PROD, "a"), rm("a")),
        ],
        [],
    ),
    (
        "same-heartbeat-under-two-prefixes-delete-winner-no-change",
        [LB, PROD],
        [
            (Put(LB, hb("a", 10)), up("a", 10)),
            (Put(PROD, hb("a", 10)), None),
            (Delete(PROD, "a"), None),
            (Delete(LB, "a"), rm("a")),
        ],
        [],
    ),
    (
        "workers-are-independent",
        [PROD],
        [
            (Put(PROD, hb("a", 1)), up("a", 1)),
            (Put(PROD, hb("b", 2)), up("b", 2)),
            (Delete(PROD, "a"), rm("a")),
        ],
        [hb("b", 2)],
    ),
    (
        "replace-into-empty-upserts-in-address-order",
        [PROD],
        [(Replace(PROD, (hb("b", 1), hb("a", 2))), [up("a", 2), up("b", 1)])],
        [hb("a", 2), hb("b", 1)],
    ),
    (
        "replace-removes-unlisted-keeps-unchanged-silent",
        [PROD],
        [
            (
                Replace(PROD, (hb("a", 1), hb("b", 1), hb("c", 1))),
                [up("a", 1), up("b", 1), up("c", 1)],
            ),
            (
                Replace(PROD, (hb("b", 1), hb("c", 2), hb("d", 1))),
                [rm("a"), up("c", 2), up("d", 1)],
            ),
        ],
        [hb("b", 1), hb("c", 2), hb("d", 1)],
    ),
    (
        "replace-with-empty-removes-everything",
        [PROD],
        [
            (Put(PROD, hb("a", 1)), up("a", 1)),
            (Put(PROD, hb("b", 1)), up("b", 1)),
            (Replace(PROD, ()), [rm("a"), rm("b")]),
        ],
        [],
    ),
    (
        "replace-identical-list-is-no-change",
        [PROD],
        [
            (Replace(PROD, (hb("a", 1),)), [up("a", 1)]),
            (Replace(PROD, (hb("a", 1),)), []),
        ],
        [hb("a", 1)],
    ),
    (
        "replace-one-prefix-keeps-workers-of-another",
        [LB, PROD],
        [
            (Put(LB, hb("a", 5)), up("a", 5)),
            (Put(PROD, hb("a", 9, 2)), up("a", 9, 2)),
            (Put(PROD, hb("b", 1)), up("b", 1)),
            # a falls back to its legacy entry; b is gone everywhere.
            (Replace(PROD, ()), [up("a", 5), rm("b")]),
        ],
        [hb("a", 5)],
    ),
    (
        "replace-with-older-heartbeat-loses-to-other-prefix",
        [LB, PROD],
        [
            (Put(LB, hb("a", 5)), up("a", 5)),
            (Replace(PROD, (hb("a", 4, 2), hb("b", 1))), [up("b", 1)]),
        ],
        [hb("a", 5), hb("b", 1)],
    ),
    (
        "replace-duplicate-address-last-one-counts",
        [PROD],
        [(Replace(PROD, (hb("a", 1), hb("a", 2))), [up("a", 2)])],
        [hb("a", 2)],
    ),
]


@pytest.mark.parametrize(
    ("prefixes", "steps", "merged"),
    [(p, s, m) for _, p, s, m in SCENARIOS],
    ids=[i for i, _, _, _ in SCENARIOS],
)
def test_merge_scenarios(
    prefixes: list[str], steps: list[tuple[Op, Expected]], merged: list[WorkerHeartbeat]
) -> None:
    merge = RegistryMerge(prefixes)
    for i, (op, expected) in enumerate(steps):
        assert _apply(merge, op) == expected, f"step {i}: {op}"
    assert sorted(merge.merged(), key=lambda h: h.worker_addr) == merged


COUNTS = [
    # (id, prefixes, puts, expected {format: count})
    ("empty", [LB, PROD], [], {RegistryFormat.LEGACY: 0, RegistryFormat.V2: 0}),
    (
        "same-worker-in-both-formats-counts-in-each",
        [LB, PROD],
        [(LB, "a"), (PROD, "a")],
        {RegistryFormat.LEGACY: 1, RegistryFormat.V2: 1},
    ),
    (
        "same-worker-under-two-v2-prefixes-counts-once",
        [PROD, TEST],
        [(PROD, "a"), (TEST, "a"), (TEST, "b")],
        {RegistryFormat.LEGACY: 0, RegistryFormat.V2: 2},
    ),
    (
        "same-worker-under-two-legacy-prefixes-counts-once",
        [LB, LW, PROD],
        [(LB, "a"), (LW, "a"), (LW, "c"), (PROD, "b")],
        {RegistryFormat.LEGACY: 2, RegistryFormat.V2: 1},
    ),
]


@pytest.mark.parametrize(
    ("prefixes", "puts", "expected"),
    [(p, u, e) for _, p, u, e in COUNTS],
    ids=[i for i, _, _, _ in COUNTS],
)
def test_worker_count_by_format(
    prefixes: list[str], puts: list[tuple[str, str]], expected: dict[RegistryFormat, int]
) -> None:
    merge = RegistryMerge(prefixes)
    for prefix, addr in puts:
        merge.put(prefix, hb(addr, 1))
    assert merge.worker_count_by_format() == expected


def test_worker_count_drops_after_delete_and_replace() -> None:
    merge = RegistryMerge([LB, PROD])
    merge.put(LB, hb("a", 1))
    merge.put(PROD, hb("a", 1))
    merge.put(PROD, hb("b", 1))
    merge.delete(LB, "a")
    assert merge.worker_count_by_format() == {RegistryFormat.LEGACY: 0, RegistryFormat.V2: 2}
    merge.replace_prefix(PROD, [hb("b", 2)])
    assert merge.worker_count_by_format() == {RegistryFormat.LEGACY: 0, RegistryFormat.V2: 1}


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.put(TEST, hb("a", 1)),
        lambda m: m.delete(TEST, "a"),
        lambda m: m.replace_prefix(TEST, []),
        lambda m: m.put("/blockx/prod/lanes/default/bundle-workers", hb("a", 1)),
    ],
    ids=["put", "delete", "replace", "prefix-without-slash"],
)
def test_unwatched_prefix_raises_key_error(call: Callable[[RegistryMerge], object]) -> None:
    merge = RegistryMerge([LB, PROD])
    with pytest.raises(KeyError, match="not watched"):
        call(merge)
    assert merge.merged() == []


def test_empty_prefix_list_raises() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RegistryMerge([])


def test_invalid_prefix_raises() -> None:
    with pytest.raises(InvalidRegistryPrefix):
        RegistryMerge([PROD, "/blockx/prod/lanes/default/workers"])


def test_prefixes_keep_their_order() -> None:
    assert RegistryMerge([TEST, LB, PROD]).prefixes == [TEST, LB, PROD]


# ---- property: the merged view equals the rule applied to the per-prefix tables ----

_PREFIXES = [LB, LW, PROD, TEST]
_V2 = {PROD, TEST}


def _reference_winner(
    tables: dict[str, dict[str, WorkerHeartbeat]], addr: str
) -> WorkerHeartbeat | None:
    entries = [(p, t[addr]) for p, t in tables.items() if addr in t]
    if not entries:
        return None
    # Newest heartbeat, then v2, then the smaller prefix string.
    entries.sort(key=lambda e: (-e[1].last_heartbeat_ms, e[0] not in _V2, e[0]))
    return entries[0][1]


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete", "replace"]),
        st.sampled_from(_PREFIXES),
        st.lists(
            st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 2)),
            min_size=0,
            max_size=3,
        ),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops)
def test_merge_matches_reference(ops: list[tuple[str, str, list[tuple[str, int, int]]]]) -> None:
    merge = RegistryMerge(_PREFIXES)
    tables: dict[str, dict[str, WorkerHeartbeat]] = {p: {} for p in _PREFIXES}
    published: dict[str, WorkerHeartbeat] = {}
    for kind, prefix, items in ops:
        before = {a: _reference_winner(tables, a) for a in "abc"}
        beats = [hb(a, last, slots) for a, last, slots in items]
        if kind == "put":
            if not beats:
                continue
            tables[prefix][beats[0].worker_addr] = beats[0]
            one = merge.put(prefix, beats[0])
            changes = [] if one is None else [one]
        elif kind == "delete":
            addr = items[0][0] if items else "a"
            tables[prefix].pop(addr, None)
            one = merge.delete(prefix, addr)
            changes = [] if one is None else [one]
        else:
            tables[prefix] = {b.worker_addr: b for b in beats}
            changes = merge.replace_prefix(prefix, beats)
        expected: list[MergeChange] = []
        for a in "abc":
            after = _reference_winner(tables, a)
            if after == before[a]:
                continue
            expected.append(WorkerRemoved(a) if after is None else WorkerUpserted(after))
        assert changes == expected
        for change in changes:
            if isinstance(change, WorkerUpserted):
                published[change.heartbeat.worker_addr] = change.heartbeat
            else:
                published.pop(change.worker_addr)
        # Replaying the changes gives exactly the merged view.
        assert sorted(merge.merged(), key=lambda h: h.worker_addr) == [
            published[a] for a in sorted(published)
        ]
