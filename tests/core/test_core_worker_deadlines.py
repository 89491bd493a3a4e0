"""DeadlineHeap against a dict model: lazy deletion never changes an answer.

A random sequence of set / cancel / earliest / pop_due must answer exactly what a
plain ``{key: deadline}`` dict answers by scanning, and the heap must stay bounded
by its live keys (stale entries are rebuilt away).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from blockx_core.deadlines import DeadlineHeap

KEYS = st.sampled_from("abcdefgh")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("cancel"), KEYS, st.just(0)),
        st.tuples(st.just("pop"), st.just(""), st.integers(min_value=0, max_value=50)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_heap_answers_like_a_scan(ops: list[tuple[str, str, int]]) -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    model: dict[str, int] = {}
    for op, key, value in ops:
        if op == "set":
            heap.set(key, value)
            model[key] = value
        elif op == "cancel":
            heap.cancel(key)
            model.pop(key, None)
        else:
            fired = list(heap.pop_due(value))
            # Exactly the due keys, each once, earliest first.
            assert sorted(fired) == sorted(k for k, d in model.items() if d <= value)
            assert [model[k] for k in fired] == sorted(model[k] for k in fired)
            for k in fired:
                del model[k]
        assert heap.earliest_ms() == min(model.values(), default=None)
        assert len(heap) == len(model)
        assert all(heap.get(k) == d for k, d in model.items())
        assert len(heap._heap) <= max(64, 2 * len(model))


def test_a_key_set_again_to_the_same_deadline_fires_once() -> None:
    heap: DeadlineHeap[str] = DeadlineHeap()
    heap.set("a", 5)
    heap.cancel("a")
    heap.set("a", 5)
    assert list(heap.pop_due(5)) == ["a"]
    assert list(heap.pop_due(10)) == []
    assert heap.earliest_ms() is None
