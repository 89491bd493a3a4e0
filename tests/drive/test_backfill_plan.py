"""Backfill and follow decisions without a cluster: how a range is cut, which ranges
a re-run skips, how the ledger is reconciled with the chain and over which window,
when follow has missed part of the chain, which attempt outcomes are resubmitted
and under which task_id, how attempts are bounded, the running totals, and the unit
keys each driver's Builder config carries."""

from __future__ import annotations

import re

import msgspec
import pytest

from blockx_client import Client, ClientFailureCode, FailureCode, TaskResult, TaskState
from blockx_client.attempts import RETRY_BACKOFF, Attempt, AttemptBook, Retrying, Verdict, verdict
from blockx_client.models import PluginConfig, Task
from blockx_drive import follow
from blockx_drive._backfill import (
    BackfillDone,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
    TaskRange,
    plan,
    split,
)
from blockx_drive._backfill.plan import bundle_task, missing_block
from blockx_drive._backfill.progress import Tally
from blockx_drive._follow import BlockWritten, GapReason, LedgerReconciled, ReorgReconciled
from blockx_drive._follow.follower import Follower
from blockx_drive._follow.spec import FollowSpec
from blockx_drive._follow.watch import PAUSE_MS, Watch
from blockx_drive.attempts import check_attempts
from blockx_drive.call_unit import unit_config
from blockx_drive.defaults import (
    DEFAULT_BLOCKS_PER_TASK,
    DEFAULT_BUNDLE_SIZE_LIMIT,
    MAX_ATTEMPTS_LIMIT,
    OnFailure,
    default_bundle_size,
)
from blockx_drive.jobs import LagFrom
from blockx_drive.ledger import Reconciliation, reach, reconcile
from blockx_drive.spec import JobSpec, check
from blockx_drive.submission import writer_config_for

CANONICAL = {n: f"0x{n:02x}" for n in range(10)}


def test_a_range_is_cut_into_tasks_the_last_one_shorter() -> None:
    assert split(3, 12, 4) == [TaskRange(3, 6), TaskRange(7, 10), TaskRange(11, 12)]
    assert split(5, 5, 1000) == [TaskRange(5, 5)]
    with pytest.raises(ValueError, match="below from_block"):
        split(5, 4, 10)
    with pytest.raises(ValueError, match="blocks_per_task"):
        split(0, 4, 0)
    # Past the 63-bit INTEGER a block number is stored in: refused, never split.
    refused = re.escape("to_block must be a block number (0 to 2**63 - 1)")
    with pytest.raises(ValueError, match=refused):
        split(0, 2**63, 1)


CASES = [
    # (written, force, ranges run)
    ({}, False, [(0, 4), (5, 9)]),
    (dict(CANONICAL), False, []),
    (dict(CANONICAL), True, [(0, 4), (5, 9)]),
    # A range written in part, or on another branch, runs again.
    ({n: CANONICAL[n] for n in range(9)}, False, [(5, 9)]),
    ({**CANONICAL, 2: "0xold"}, False, [(0, 4)]),
]


@pytest.mark.parametrize(("written", "force", "expected"), CASES)
def test_a_rerun_skips_ranges_written_for_the_current_hashes(
    written: dict[int, str], force: bool, expected: list[tuple[int, int]]
) -> None:
    planned = plan(split(0, 9, 5), CANONICAL, written, force=force)
    assert [(r.from_block, r.to_block) for r in planned.run] == expected
    assert len(planned.run) + len(planned.skipped) == 2


def test_a_block_not_in_the_database_is_found() -> None:
    assert missing_block(0, 9, CANONICAL) is None
    assert missing_block(8, 12, CANONICAL) == 10


def test_a_bundle_task_carries_the_range_and_the_writer() -> None:
    task = bundle_task(
        TaskRange(10, 19),
        function="volume",
        source_table="logs",
        where={"topic0": "0x01"},
        unit={"unit": "block"},
        bundle_size=5,
        writer="BlockBundleWriteResultHandler",
        writer_config={"table": "volume"},
    )
    assert task.function_call_config == PluginConfig(
        type="BlockBundleCallConfig",
        config={
            "function": "volume",
            "table": "logs",
            "fromBlock": 10,
            "toBlock": 19,
            "unit": "block",
            "bundleSize": 5,
            "where": {"topic0": "0x01"},
        },
    )
    assert task.result_handler == PluginConfig(
        type="BlockBundleWriteResultHandler", config={"table": "volume"}
    )


def test_the_event_unit_names_its_abi_and_event_in_both_drivers_tasks() -> None:
    unit = unit_config("event", "logs", "pair", "Swap")
    assert unit == {"unit": "event", "abi": "pair", "event": "Swap"}
    backfill_config = bundle_task(
        TaskRange(0, 9),
        function="swap",
        source_table="logs",
        where=None,
        unit=unit,
        bundle_size=None,
        writer="BlockBundleWriteResultHandler",
        writer_config={"table": "swaps"},
    ).function_call_config.config
    job = JobSpec(
        function="swap",
        source_table="logs",
        unit="event",
        abi="pair",
        event="Swap",
        sink_table="swaps",
        db_url="sqlite:///blocks.db",
        sink_db_url="sqlite:///sink.db",
        tasks_in_flight=1,
        max_attempts=1,
        on_failure=OnFailure.CONTINUE,
    )
    follow_config = (
        FollowSpec(
            job,
            check(job, writer="BlockWriteResultHandler"),
            job_id="follow-x",
            reorg_window=8,
            poll_interval_s=1.0,
        )
        .task(7, "0x" + "07" * 32)
        .function_call_config.config
    )
    for config in (backfill_config, follow_config):
        assert (config["unit"], config["abi"], config["event"]) == ("event", "pair", "Swap")
    assert unit_config("row", "logs", None, None) == {"unit": "row"}


@pytest.mark.parametrize(
    ("unit", "table", "abi", "event", "message"),
    [
        ("rows", "logs", None, None, "unit must be one of row, block, event, got 'rows'"),
        ("event", "logs", "pair", None, "the event unit needs abi (a registered ABI's name"),
        ("event", "logs", None, "Swap", "the event unit needs abi"),
        ("event", "transactions", "pair", "Swap", "the event unit reads the logs table, not"),
        ("block", "logs", "pair", None, "abi and event go with the event unit"),
        ("row", "logs", None, "Swap", "abi and event go with the event unit"),
    ],
)
def test_a_unit_that_cannot_be_built_is_refused_in_one_line(
    unit: str, table: str, abi: str | None, event: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        unit_config(unit, table, abi, event)
    assert "\n" not in str(refused.value)


RECONCILE = [
    # (written, canonical, expected)
    ({1: "a", 2: "b"}, {1: "a", 2: "b"}, Reconciliation()),
    # Same height, new branch: rewrite on the new hashes.
    ({1: "a", 2: "b", 3: "c"}, {1: "a", 2: "B", 3: "C"}, Reconciliation(rewrite={2: "B", 3: "C"})),
    # A shorter new branch: what is above its head goes.
    ({1: "a", 2: "b", 3: "c"}, {1: "a", 2: "B"}, Reconciliation(rewrite={2: "B"}, delete=(3,))),
    ({4: "d"}, {}, Reconciliation(delete=(4,))),
]


@pytest.mark.parametrize(("written", "canonical", "expected"), RECONCILE)
def test_the_ledger_is_reconciled_with_the_canonical_chain(
    written: dict[int, str], canonical: dict[int, str], expected: Reconciliation
) -> None:
    assert reconcile(written, canonical) == expected


REACH = [
    # (ledger top, database head, finalized, reorg window, lowest block compared)
    (100, 100, 90, 64, 37),  # the window below the head reaches lower than finality
    (100, 100, 20, 64, 21),  # every block above the finalized height
    (100, 100, None, 64, 0),  # nothing final yet: the whole ledger
    (100, 97, 90, 64, 34),  # a shorter chain: the window is below its head
    (100, 120, 110, 64, 37),  # the chain moved on: below the ledger's own head
    (10, 10, 5, 64, 0),  # never below block 0
    (100, 100, 99, 1, 100),
]


@pytest.mark.parametrize(("top", "head", "finalized", "window", "expected"), REACH)
def test_the_window_a_reorg_can_reach(
    top: int, head: int, finalized: int | None, window: int, expected: int
) -> None:
    assert reach(top=top, head=head, finalized=finalized, reorg_window=window) == expected


def test_a_reorg_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="reorg_window must be >= 1"):
        reach(top=10, head=10, finalized=None, reorg_window=0)


POLL_MS = 100
# Each step: (milliseconds after the start, what happens, the gap ``due`` reports
# at that moment after it).
WATCH = [
    # Looks a poll interval apart: no gap.
    [(100, "looked", None), (200, "looked", None)],
    # A look that comes later than the pause bound after the one before.
    [(100, "looked", None), (100 + PAUSE_MS + POLL_MS + 1, "due", GapReason.PAUSED)],
    [(PAUSE_MS + POLL_MS, "due", None)],
    # A failed look: due until a look goes through, however soon.
    [(100, "lost", GapReason.UNREACHABLE), (150, "due", GapReason.UNREACHABLE)],
    [(100, "lost", GapReason.UNREACHABLE), (200, "looked", None), (300, "due", None)],
]


@pytest.mark.parametrize("steps", WATCH)
def test_follow_knows_when_it_missed_part_of_the_chain(
    steps: list[tuple[int, str, GapReason | None]],
) -> None:
    watch = Watch(0, poll_interval_ms=POLL_MS)
    for at_ms, happens, expected in steps:
        match happens:
            case "looked":
                watch.looked(at_ms)
            case "lost":
                watch.lost(0.5)
        assert watch.due(at_ms) is expected


def test_a_database_out_of_reach_is_tried_again_with_a_back_off() -> None:
    watch = Watch(0, poll_interval_ms=POLL_MS)
    # The longest wait of each (the draw at its top end); half of it at least.
    assert [watch.lost(1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    watch.looked(1)
    assert watch.lost(1.0) == 0.5
    assert watch.lost(0.0) == 0.5


def test_attempts_are_bounded_and_the_choice_after_a_failure_checked() -> None:
    assert check_attempts(1, "stop") is OnFailure.STOP
    assert check_attempts(MAX_ATTEMPTS_LIMIT, OnFailure.CONTINUE) is OnFailure.CONTINUE
    for bad in (0, MAX_ATTEMPTS_LIMIT + 1, None, True, 2.5):
        with pytest.raises(ValueError, match="max_attempts must be a whole number from 1 to"):
            check_attempts(bad, "stop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_failure must be 'continue' or 'stop', got 'skip'"):
        check_attempts(3, "skip")


def test_declared_columns_are_checked_before_anything_is_submitted() -> None:
    assert writer_config_for({"columns": {"volume": "numeric"}}, "t") == {
        "columns": {"volume": "numeric"},
        "table": "t",
    }
    assert writer_config_for(None, "t") == {"table": "t"}
    with pytest.raises(ValueError, match=re.escape("not one of INTEGER|TEXT|REAL|NUMERIC|JSON")):
        writer_config_for({"columns": {"volume": "FLOAT"}}, "t")
    with pytest.raises(ValueError, match="is not a usable name"):
        writer_config_for({"columns": {"1x": "TEXT"}}, "t")
    with pytest.raises(ValueError, match="columns must map column names to types"):
        writer_config_for({"columns": ["volume"]}, "t")


def result(
    state: TaskState,
    *,
    retryable: bool = False,
    code: FailureCode | ClientFailureCode | None = None,
) -> TaskResult:
    return TaskResult(task_id="t", state=state, retryable=retryable, failure_code=code)


VERDICTS = [
    (result(TaskState.SUCCEEDED), Verdict.DONE),
    (result(TaskState.FAILED, retryable=True, code=FailureCode.PLUGIN_FAILED), Verdict.RETRY),
    (result(TaskState.FAILED, code=FailureCode.BUILDER_FAILED), Verdict.FAILED),
    # Lost with its Worker, however the SDK spells it.
    (result(TaskState.NOT_FOUND), Verdict.RETRY),
    (result(TaskState.FAILED, code=ClientFailureCode.WORKER_LOST), Verdict.RETRY),
]


@pytest.mark.parametrize(("outcome", "expected"), VERDICTS)
def test_which_outcomes_are_resubmitted(outcome: TaskResult, expected: Verdict) -> None:
    assert verdict(outcome) is expected


def test_a_resubmission_has_a_new_task_id_of_its_lineage() -> None:
    task = Task(function_call_config=PluginConfig(type="BlockBundleCallConfig"))
    first = Attempt(key=0, task=task, original_task_id="backfill-1")
    assert first.as_task().task_id == "backfill-1"
    assert Attempt(key=0, task=task, original_task_id="backfill-1", number=3).as_task().task_id == (
        "backfill-1.retry-3"
    )
    # The first attempt is due at once; the longest waits before the next ones.
    book = AttemptBook(max_attempts=10)
    attempt = book.open(0, task, "backfill-1", now_ms=7)
    assert attempt.due_ms == 7
    lost = TaskResult(
        task_id="t", state=TaskState.FAILED, failure_code=ClientFailureCode.WORKER_LOST
    )
    waits = []
    for _ in range(9):
        judged = book.judge(attempt, lost, now_ms=0, draw=1.0)
        assert isinstance(judged, Retrying)
        attempt = judged.next
        waits.append(attempt.due_ms / 1000)
    assert [waits[n - 2] for n in (2, 3, 10)] == [0.5, 1.0, 5.0]
    assert RETRY_BACKOFF.ceiling(1) == 0.5


def finished(outcome: TaskOutcome, blocks: int, rows: int) -> TaskFinished:
    return TaskFinished(
        task_id="t",
        original_task_id="t",
        attempt=1,
        from_block=0,
        to_block=blocks - 1,
        outcome=outcome,
        blocks=blocks,
        rows=rows,
    )


def test_the_totals_rates_and_eta() -> None:
    planned = BackfillPlanned(
        job_id="backfill-1",
        from_block=0,
        to_block=99,
        tasks=4,
        blocks=100,
        skipped_tasks=1,
        skipped_blocks=25,
    )
    tally = Tally(planned, started=0.0)
    first = tally.record(finished(TaskOutcome.WRITTEN, 25, 50), now=1.0)
    assert (first.blocks_done, first.rows_done, first.tasks_done) == (25, 50, 1)
    assert (first.blocks_per_s, first.rows_per_s, first.eta_s) == (25.0, 50.0, 3.0)
    tally.record(finished(TaskOutcome.RETRYING, 25, 0), now=1.5)
    last = tally.record(finished(TaskOutcome.FAILED, 25, 0), now=2.0)
    assert (last.tasks_done, last.tasks_failed) == (1, 1)
    assert tally.summary(now=2.0) == BackfillDone(
        blocks=25,
        rows=50,
        tasks=2,
        failed=1,
        seconds=2.0,
        skipped=1,
        retries=1,
        blocks_per_s=12.5,
        rows_per_s=25.0,
        unfinished=2,  # of the 4 planned, 2 never ended (the run stopped)
    )


def test_events_encode_as_one_object_naming_the_event() -> None:
    done = msgspec.json.decode(
        msgspec.json.encode(BackfillDone(blocks=1, rows=2, tasks=1, failed=0, seconds=0.5))
    )
    assert done["event"] == "done"
    assert {"blocks", "rows", "tasks", "failed", "seconds"} <= set(done)
    task = msgspec.json.decode(msgspec.json.encode(finished(TaskOutcome.WRITTEN, 1, 1)))
    assert (task["event"], task["outcome"]) == ("task", "written")
    block = BlockWritten(
        number=1,
        hash="0x1",
        rows=0,
        task_id="t",
        attempt=1,
        lag_ms=5,
        lag_from=LagFrom.INGEST,
        seen_lag_ms=1,
    )
    decoded = msgspec.json.decode(msgspec.json.encode(block))
    assert (decoded["event"], decoded["lag_from"]) == ("block", "ingest")
    reorg = ReorgReconciled(reorg_id=1, fork_block_number=3, depth=2, rewritten=(4,), deleted=(5,))
    assert msgspec.json.decode(msgspec.json.encode(reorg)) == {
        "event": "reorg",
        "reorg_id": 1,
        "fork_block_number": 3,
        "depth": 2,
        "rewritten": [4],
        "deleted": [5],
    }
    checked = LedgerReconciled(
        reason=GapReason.START, from_block=3, to_block=9, checked=7, rewritten=(8,), deleted=(9,)
    )
    assert msgspec.json.decode(msgspec.json.encode(checked)) == {
        "event": "reconcile",
        "reason": "start",
        "from_block": 3,
        "to_block": 9,
        "checked": 7,
        "rewritten": [8],
        "deleted": [9],
    }


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ({5: "a", 6: "b", 7: "c"}, 8),  # no gap: after the highest
        ({5: "a", 7: "c"}, 6),  # an interrupted run left block 6 out
    ],
)
def test_follow_resumes_at_the_oldest_gap_of_the_ledger(
    written: dict[int, str], expected: int
) -> None:
    assert Follower._oldest_gap(written, 5, 7) == expected


def test_a_backfill_without_a_bundle_size_writes_each_task_in_one_transaction() -> None:
    assert default_bundle_size(DEFAULT_BLOCKS_PER_TASK) == DEFAULT_BLOCKS_PER_TASK
    assert default_bundle_size(7) == 7
    assert default_bundle_size(10**6) == DEFAULT_BUNDLE_SIZE_LIMIT


async def test_follow_refuses_a_from_block_no_block_number_can_be() -> None:
    # Past the 63-bit INTEGER a block number is stored in: refused before any database
    # is opened (SQLite raised OverflowError for it).
    job = JobSpec(
        function="volume",
        source_table="erc20_transfers",
        sink_table="v",
        db_url="sqlite:////nonexistent/blocks.db",
        sink_db_url="sqlite:////nonexistent/sink.db",
    )
    async with Client(coordinator="127.0.0.1:1") as client:
        events = follow(client, job, from_block=2**63)
        with pytest.raises(ValueError, match=re.escape("from_block must be a block number")):
            await anext(events)
