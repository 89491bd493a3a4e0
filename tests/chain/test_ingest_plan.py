"""The decisions of ingest, table-driven, without a node or a database."""

from __future__ import annotations

import pytest

from blockx_chain.ingest import DeepReorgRefused, GapRefused, IngestError, ReorgTooDeep
from blockx_chain.ingest.plan import (
    Diverges,
    Extends,
    ReorgPlan,
    StoredBlock,
    check_batch,
    finalized_number,
    fork_point,
    next_batch,
    plan_reorg,
    start_block,
    walk_window,
)


def h(branch: str, number: int) -> str:
    return f"{branch}{number}"


def chain(branch: str, numbers: range, fork: int = -1) -> dict[int, StoredBlock]:
    """Stored blocks of ``branch`` (blocks at or below ``fork`` are branch "a")."""

    def name(n: int) -> str:
        return h("a" if n <= fork else branch, n)

    return {n: StoredBlock(name(n), name(n - 1)) for n in numbers}


START_CASES = [
    # (stored head, --from, start)
    (None, None, 0),
    (None, 500, 500),
    (99, None, 100),
    (99, 100, 100),
    (99, 0, 0),
    (99, 50, 50),
]


@pytest.mark.parametrize(("head", "requested", "expected"), START_CASES)
def test_start_block(head: int | None, requested: int | None, expected: int) -> None:
    assert start_block(head, requested) == expected


def test_a_from_above_head_plus_one_is_a_gap() -> None:
    with pytest.raises(GapRefused, match="would leave a gap"):
        start_block(99, 101)


def test_a_negative_from_is_refused() -> None:
    with pytest.raises(IngestError, match="0 or more"):
        start_block(None, -1)


BATCH_CASES = [
    # (next, target, size, batch)
    (0, 100, 50, range(0, 50)),
    (50, 60, 50, range(50, 61)),
    (60, 60, 50, range(60, 61)),
    (61, 60, 50, None),
    (0, 0, 1, range(0, 1)),
]


@pytest.mark.parametrize(("next_number", "target", "size", "expected"), BATCH_CASES)
def test_next_batch(next_number: int, target: int, size: int, expected: range | None) -> None:
    assert next_batch(next_number, target, size) == expected


FINALIZED_CASES = [
    # (head, confirmations, node finalized, previous, finalized)
    (None, 12, None, None, None),
    (5, 12, None, None, None),  # fewer blocks than confirmations
    (12, 12, None, None, 0),
    (100, 12, None, None, 88),
    (100, 12, 36, None, 36),  # the node's finalized block is lower
    (100, 12, 95, None, 88),  # the node's is higher: confirmations decide
    (100, 12, 36, 50, 50),  # never goes back down
    (40, 12, None, 50, 40),  # ... but never above the head
    (100, 0, None, None, 100),
]


@pytest.mark.parametrize(("head", "confirmations", "node", "previous", "expected"), FINALIZED_CASES)
def test_finalized_number(
    head: int | None, confirmations: int, node: int | None, previous: int | None, expected: int
) -> None:
    assert finalized_number(head, confirmations, node, previous) == expected


Batch = tuple[list[int], list[str], list[str]]


def _batch(branch: str, numbers: range, fork: int = -1) -> Batch:
    """A fetched batch: numbers, hashes, parent hashes."""
    blocks = chain(branch, numbers, fork)
    hashes = [blocks[n].hash for n in numbers]
    return list(numbers), hashes, [blocks[n].parent_hash for n in numbers]


CHECK_CASES = [
    # (batch, stored, verdict)
    # an empty database
    (_batch("a", range(0, 10)), {}, Extends()),
    # the next blocks on the stored head
    (_batch("a", range(10, 20)), chain("a", range(0, 10)), Extends()),
    # a re-run of stored blocks with the same hashes
    (_batch("a", range(3, 6)), chain("a", range(0, 10)), Extends()),
    # the parent of the batch is not the stored head: walk back below the batch
    (_batch("b", range(10, 20), fork=7), chain("a", range(0, 10)), Diverges(fork=None)),
    # a re-run meets a stored branch the node left at block 5 (fork: 4)
    (_batch("b", range(3, 8), fork=4), chain("a", range(0, 10)), Diverges(fork=4)),
    # a run that joins the database from below, onto another branch
    (_batch("b", range(0, 5)), chain("a", range(5, 10)), Diverges(fork=None)),
    # ... and onto the same one
    (_batch("a", range(0, 5)), chain("a", range(5, 10)), Extends()),
]


@pytest.mark.parametrize(("batch", "stored", "expected"), CHECK_CASES)
def test_check_batch(
    batch: Batch,
    stored: dict[int, StoredBlock],
    expected: Extends | Diverges,
) -> None:
    numbers, hashes, parents = batch
    window = {n: b for n, b in stored.items() if numbers[0] - 1 <= n <= numbers[-1] + 1}
    assert check_batch(numbers, hashes, parents, window) == expected


FORK_CASES = [
    # (stored, node, top, fork)
    ({n: h("a", n) for n in range(10)}, {n: h("a", n) for n in range(10)}, 9, 9),
    (
        {n: h("a", n) for n in range(10)},
        {n: h("a" if n <= 4 else "b", n) for n in range(10)},
        9,
        4,
    ),
    ({n: h("a", n) for n in range(5, 10)}, {n: h("b", n) for n in range(5, 10)}, 9, None),
    ({}, {}, 3, None),
]


@pytest.mark.parametrize(("stored", "node", "top", "expected"), FORK_CASES)
def test_fork_point(
    stored: dict[int, str], node: dict[int, str], top: int, expected: int | None
) -> None:
    assert fork_point(stored, node, top) == expected


def test_the_walk_window_ends_max_depth_below_the_head() -> None:
    assert walk_window(99, 100, 64) == range(36, 100)
    assert walk_window(10, 10, 64) == range(0, 11)


PLAN_CASES = [
    # (fork, head, finalized, max depth, allow, plan)
    (95, 100, 88, 64, False, ReorgPlan(fork_block_number=95, depth=5, new_epoch=False)),
    (99, 100, None, 64, False, ReorgPlan(fork_block_number=99, depth=1, new_epoch=False)),
    (88, 100, 88, 64, False, ReorgPlan(fork_block_number=88, depth=12, new_epoch=False)),
    (36, 100, 88, 64, True, ReorgPlan(fork_block_number=36, depth=64, new_epoch=True)),
]


@pytest.mark.parametrize(("fork", "head", "finalized", "depth", "allow", "expected"), PLAN_CASES)
def test_plan_reorg(
    fork: int, head: int, finalized: int | None, depth: int, allow: bool, expected: ReorgPlan
) -> None:
    assert plan_reorg(fork, head, finalized, depth, allow) == expected


@pytest.mark.parametrize("fork", [None, 35])
def test_a_reorg_deeper_than_the_limit_is_an_error(fork: int | None) -> None:
    with pytest.raises(ReorgTooDeep, match="--max-reorg-depth"):
        plan_reorg(fork, 100, None, 64, allow_deep_reorg=True)


def test_a_reorg_below_the_finalized_block_needs_allow_deep_reorg() -> None:
    with pytest.raises(DeepReorgRefused, match="--allow-deep-reorg"):
        plan_reorg(80, 100, 88, 64, allow_deep_reorg=False)
