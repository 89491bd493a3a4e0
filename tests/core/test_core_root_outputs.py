"""RootOutputs: a task's outputs tagged as they are read, the same as tagging all."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx_core.calls import CallContext, RootOutput, RootOutputs

values = st.lists(st.sampled_from([b"null", b"1", b'{"a":2}', b"[]"]), max_size=30)
contexts = st.one_of(st.none(), st.builds(CallContext, block_number=st.integers(0, 9)))


def eager(outs: list[bytes], ctxs: list[CallContext | None] | None) -> list[RootOutput]:
    if ctxs is None:
        return [RootOutput(i, v) for i, v in enumerate(outs)]
    return [RootOutput(i, v, c) for i, (v, c) in enumerate(zip(outs, ctxs, strict=True))]


@given(values, st.booleans(), st.data())
def test_reading_them_gives_the_eagerly_tagged_outputs(
    outs: list[bytes], with_contexts: bool, data: st.DataObject
) -> None:
    ctxs = (
        data.draw(st.lists(contexts, min_size=len(outs), max_size=len(outs)))
        if with_contexts
        else None
    )
    lazy, expected = RootOutputs(outs, ctxs), eager(outs, ctxs)
    assert list(lazy) == expected
    assert lazy == expected
    assert len(lazy) == len(expected)
    assert [lazy[i] for i in range(-len(outs), len(outs))] == expected + expected
    assert lazy[1:-1:2] == expected[1:-1:2]


def test_an_index_out_of_range_and_contexts_that_do_not_match_are_refused() -> None:
    lazy = RootOutputs([b"1", b"2"])
    with pytest.raises(IndexError):
        lazy[2]
    with pytest.raises(IndexError):
        lazy[-3]
    with pytest.raises(ValueError, match="one context per output"):
        RootOutputs([b"1"], [None, None])
    assert lazy != [RootOutput(0, b"1")]
    assert lazy != RootOutputs([b"1", b"3"])
