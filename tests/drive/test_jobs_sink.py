"""Job records in a real sink, on both engines: ``JobRecorder`` writes a run's
record (batched, refreshed, ended as the run ended), ``read_jobs`` / ``list_jobs``
read it back checked, from another store as from another process; the drivers'
events fold into it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support import wait_until

from blockx_chain.sink import JobEntry, SinkStore, open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_drive._backfill.progress import (
    BackfillDone,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
)
from blockx_drive._backfill.record import backfill_progress
from blockx_drive._follow.events import BlockFailed, BlockWritten, FollowEvent, FollowStarted
from blockx_drive._follow.record import FollowProgress
from blockx_drive.job_progress import new_record
from blockx_drive.jobs import (
    MAX_FAILURES,
    STALE_AFTER_MS,
    BadJobRecord,
    JobKind,
    JobProgress,
    JobRecorder,
    JobState,
    LagFrom,
    list_jobs,
    read_jobs,
    redacted,
)


def _record(job_id: str = "backfill-1", **fields: Any) -> JobProgress:
    record = new_record(
        JobKind.BACKFILL,
        job_id=job_id,
        command="blockx backfill --sink-db postgresql://me:secret@db/sink",
        function="f",
        source_table="logs",
        sink_table="t",
        chain="base",
        chain_id=8453,
        now_ms=1_000,
    )
    return msgspec.structs.replace(record, **fields)


async def _listed(sink: SinkStore, db_url: str) -> list[JobProgress]:
    del sink  # read as another process would: a store of its own, read-only
    return await list_jobs(parse_blockdb_url(db_url))


async def test_a_record_is_written_at_start_batched_while_it_runs_and_kept_after(
    db_url: str, sink: SinkStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[JobEntry] = []
    put = sink.put_job

    async def counted(entry: JobEntry, *, prune: bool = False) -> None:
        writes.append(entry)
        await put(entry, prune=prune)

    monkeypatch.setattr(sink, "put_job", counted)
    async with JobRecorder(sink, _record(), interval_s=3600, refresh_s=3600) as recorder:
        [started] = await _listed(sink, db_url)
        assert (started.job_id, started.state, started.task_prefix) == (
            "backfill-1",
            JobState.RUNNING,
            "backfill-1-",
        )
        assert started.command == "blockx backfill --sink-db postgresql://me:***@db/sink"
        # A hot run: a thousand updates, no write until the next round.
        for blocks in range(1_000):
            recorder.update(_record(blocks_done=blocks))
    assert len(writes) == 2  # when it started, when it ended
    [job] = await _listed(sink, db_url)
    assert (job.blocks_done, job.state) == (999, JobState.STOPPED)
    assert job.ended_ms is not None
    assert job.ended_ms >= job.started_ms


async def test_updates_reach_the_sink_while_the_job_runs(db_url: str, sink: SinkStore) -> None:
    async with JobRecorder(sink, _record(), interval_s=0.01) as recorder:
        recorder.update(_record(blocks_done=5))

        async def written() -> bool:
            return [j.blocks_done for j in await _listed(sink, db_url)] == [5]

        await wait_until(written, "the update in the sink")


@pytest.mark.parametrize(
    ("error", "state", "message"),
    [
        (
            RuntimeError("the cluster is gone\nmore"),
            JobState.FAILED,
            "RuntimeError: the cluster is gone",
        ),
        (asyncio.CancelledError(), JobState.STOPPED, "stopped before its end; a re-run resumes"),
    ],
)
async def test_how_a_run_ended_is_its_last_state(
    sink: SinkStore, db_url: str, error: BaseException, state: JobState, message: str
) -> None:
    with pytest.raises(type(error)):
        async with JobRecorder(sink, _record(last_block=7)):
            raise error
    [job] = await _listed(sink, db_url)
    assert (job.state, job.message, job.last_block) == (state, message, 7)


async def test_a_record_outlives_its_store_and_a_bad_row_is_named(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    writer = await open_sink(url)
    try:
        async with JobRecorder(writer, _record("backfill-ok")) as recorder:
            recorder.update(_record("backfill-ok", state=JobState.FINISHED, blocks_done=3))
        bad = JobEntry(
            job_id="backfill-bad",
            kind="backfill",
            state="running",
            function="",
            sink_table="",
            started_ms=1,
            updated_ms=2,
            ended_ms=None,
            record='{"job_id": "backfill-bad", "kind": "backfill", "state": "running", '
            '"started_ms": 1, "updated_ms": 2, "eta_s": 1e308}',
        )
        await writer.put_job(bad)
    finally:
        await writer.close()
    records = await read_jobs(url)
    assert {type(r) for r in records} == {JobProgress, BadJobRecord}
    [refused] = [r for r in records if isinstance(r, BadJobRecord)]
    assert refused.job_id == "backfill-bad"
    assert "$.eta_s" in refused.error
    [job] = await list_jobs(url)
    assert (job.job_id, job.state, job.blocks_done) == ("backfill-ok", JobState.FINISHED, 3)
    assert [j.job_id for j in await list_jobs(url, job_id="backfill-ok")] == ["backfill-ok"]


async def test_a_sink_that_cannot_be_written_neither_blocks_nor_fails_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = await open_sink(parse_blockdb_url(f"sqlite:///{tmp_path}/sink.db"))
    with caplog.at_level(logging.WARNING, logger="blockx_drive.jobs"):
        async with JobRecorder(sink, _record(), interval_s=0.01) as recorder:
            await sink.close()  # gone under the running job
            for blocks in range(50):
                recorder.update(_record(blocks_done=blocks))
                await asyncio.sleep(0)
    warnings = [r for r in caplog.records if "cannot record job backfill-1" in r.getMessage()]
    assert len(warnings) == 1


def test_a_running_record_not_updated_for_the_bound_reads_interrupted() -> None:
    job = _record(updated_ms=10_000)
    assert job.shown_state(10_000 + STALE_AFTER_MS) is JobState.RUNNING
    assert job.shown_state(10_000 + STALE_AFTER_MS + 1) is JobState.INTERRUPTED
    ended = _record(state=JobState.FINISHED, updated_ms=10_000)
    assert ended.shown_state(10**12) is JobState.FINISHED


def test_passwords_are_redacted() -> None:
    assert redacted("--db postgresql://u:p%40ss@h:5/d --sink-db postgres://v:x@h/s") == (
        "--db postgresql://u:***@h:5/d --sink-db postgres://v:***@h/s"
    )
    assert redacted("postgresql://h/d?sslmode=require&password=hunter2") == (
        "postgresql://h/d?sslmode=require&password=***"
    )
    assert redacted("sqlite:////tmp/sink.db") == "sqlite:////tmp/sink.db"


def _task(outcome: TaskOutcome, from_block: int, **totals: Any) -> TaskFinished:
    return TaskFinished(
        task_id=f"backfill-1-{from_block}",
        original_task_id=f"backfill-1-{from_block}",
        attempt=2,
        from_block=from_block,
        to_block=from_block + 9,
        outcome=outcome,
        blocks=10 if outcome is TaskOutcome.WRITTEN else 0,
        rows=0,
        failure_code="" if outcome is TaskOutcome.WRITTEN else "CALL_FAILED",
        failure_message="" if outcome is TaskOutcome.WRITTEN else "boom",
        **totals,
    )


def test_a_backfill_folds_into_its_record() -> None:
    job = _record()
    for at, event in enumerate(
        [
            BackfillPlanned(
                job_id="backfill-1",
                from_block=0,
                to_block=29,
                tasks=3,
                blocks=30,
                skipped_tasks=0,
                skipped_blocks=0,
            ),
            _task(TaskOutcome.WRITTEN, 0, blocks_done=10, rows_done=40, tasks_done=1, eta_s=1.5),
            _task(TaskOutcome.RETRYING, 10, blocks_done=10, rows_done=40, tasks_done=1),
            _task(TaskOutcome.FAILED, 20, blocks_done=10, tasks_done=1, tasks_failed=1),
            BackfillDone(blocks=10, rows=40, tasks=2, failed=1, seconds=1.0, retries=1),
        ],
        start=2_000,
    ):
        job = backfill_progress(job, event, at)  # type: ignore[arg-type]
    assert job.state is JobState.FAILED  # one task failed for good
    assert (job.from_block, job.to_block, job.blocks_total, job.tasks_total) == (0, 29, 30, 3)
    assert (job.blocks_done, job.rows_done, job.retries, job.last_block) == (10, 40, 1, 9)
    [failure] = job.failures
    assert (failure.from_block, failure.task_id, failure.code, failure.message) == (
        20,
        "backfill-1-20",
        "CALL_FAILED",
        "boom",
    )
    assert job.message == "blocks 20..29: CALL_FAILED: boom"


def _written(number: int, rows: int, lag_ms: int) -> BlockWritten:
    return BlockWritten(
        number=number,
        hash=hex(number),
        rows=rows,
        task_id=f"follow-1-{number}",
        attempt=1,
        lag_ms=lag_ms,
        lag_from=LagFrom.INGEST,
        seen_lag_ms=lag_ms // 2,
    )


def test_a_follow_folds_into_its_record_with_its_rate_and_lag() -> None:
    job = msgspec.structs.replace(_record(), kind=JobKind.FOLLOW)
    progress = FollowProgress()
    events: list[tuple[int, FollowEvent]] = [
        (1_000, FollowStarted(job_id="follow-1", from_block=5, head=9, reorg_cursor=0)),
        (2_000, _written(5, 2, 900)),
        (3_000, _written(6, 1, 400)),
        *(
            (
                3_000 + i,
                BlockFailed(
                    number=7 + i,
                    hash="0x7",
                    task_id=f"follow-1-{7 + i}",
                    attempt=3,
                    failure_code="CALL_FAILED",
                    failure_message="x" * 900,
                ),
            )
            for i in range(MAX_FAILURES + 5)
        ),
        (11_000, _written(12, 1, 250)),
    ]
    heads = []
    for at, event in events:
        job = progress.fold(job, event, at)
        heads.append((job.head, job.last_block, job.head_lag_blocks))
    assert heads[:3] == [(9, None, None), (9, 5, 4), (9, 6, 3)]
    assert heads[-1] == (MAX_FAILURES + 11, 12, MAX_FAILURES - 1)
    assert (job.blocks_done, job.rows_done, job.tasks_failed) == (3, 4, MAX_FAILURES + 5)
    assert (job.lag_ms, job.lag_from) == (250, LagFrom.INGEST)
    # Three blocks over the 10 s since the start (less than the minute counted).
    assert job.blocks_per_s == pytest.approx(0.3)
    # The last failures only, each message bounded.
    assert len(job.failures) == MAX_FAILURES
    assert job.failures[-1].from_block == 7 + MAX_FAILURES + 4
    assert all(len(f.message) == 500 for f in job.failures)
