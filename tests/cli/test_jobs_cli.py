"""``blockx jobs`` reads the job records of a real SQLite sink: the newest jobs, one
job in full, JSON; a running record whose driver stopped updating it reads
interrupted; a sink that is not there is one line, and is not made."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
from sink_cli import blockx_offline

from blockx_chain.sink import open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_drive.jobs import (
    STALE_AFTER_MS,
    JobFailure,
    JobKind,
    JobProgress,
    JobState,
    entry,
    now_ms,
)


def _records(url: str) -> tuple[JobProgress, JobProgress]:
    at = now_ms()
    failed = JobProgress(
        job_id="backfill-aaa",
        kind=JobKind.BACKFILL,
        state=JobState.FAILED,
        started_ms=at - 60_000,
        updated_ms=at - 1_000,
        ended_ms=at - 1_000,
        command="blockx backfill --function volume --sink-db postgresql://u:***@h/s",
        function="volume",
        source_table="logs",
        sink_table="vol",
        chain="base",
        chain_id=8453,
        task_prefix="backfill-aaa-",
        from_block=0,
        to_block=99,
        blocks_total=100,
        blocks_done=90,
        tasks_done=9,
        tasks_failed=1,
        failures=(
            JobFailure(
                at_ms=at - 2_000,
                from_block=50,
                to_block=59,
                task_id="backfill-aaa-50",
                attempt=1,
                code="CALL_FAILED",
                message="ValueError: nope\nTraceback ...",
            ),
        ),
        message="blocks 50..59: CALL_FAILED: ValueError: nope",
    )
    # Its driver was killed: not updated since well before the bound.
    lost = JobProgress(
        job_id="follow-bbb",
        kind=JobKind.FOLLOW,
        state=JobState.RUNNING,
        started_ms=at - 10 * STALE_AFTER_MS,
        updated_ms=at - 2 * STALE_AFTER_MS,
        function="volume",
        sink_table="vol",
        chain_id=31337,
        task_prefix="follow-bbb-",
        blocks_done=7,
    )

    async def write() -> None:
        sink = await open_sink(parse_blockdb_url(url))
        try:
            for job in (failed, lost):
                await sink.put_job(entry(job))
        finally:
            await sink.close()

    asyncio.run(write())
    return failed, lost


def test_jobs_lists_shows_one_and_says_interrupted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sink.db"
    failed, _ = _records(url)
    code, output = blockx_offline("jobs", "--sink-db", url, tmp_path=tmp_path)
    assert code == 0, output
    assert "2 job(s)" in output
    [backfill] = [line for line in output.splitlines() if "backfill-aaa" in line]
    [follow] = [line for line in output.splitlines() if "follow-bbb" in line]
    assert ("failed" in backfill, "90/100" in backfill) == (True, True)
    assert "interrupted" in follow
    # The chain: by the name the run gave, or "-" for the Workers' only chain.
    assert ("base (8453)" in backfill, "- (31337)" in follow) == (True, True)

    code, output = blockx_offline("jobs", "backfill-aaa", "--sink-db", url, tmp_path=tmp_path)
    assert code == 0, output
    assert "blockx backfill --function volume --sink-db postgresql://u:***@h/s" in output
    assert "backfill-aaa-…" in output
    assert "backfill-aaa-50" in output
    assert "base (8453)" in output
    assert "ValueError: nope" in output
    assert "Traceback" not in output

    code, output = blockx_offline("jobs", "--json", "--sink-db", url, tmp_path=tmp_path)
    assert code == 0, output
    shown = json.loads(output)
    # The most recently updated first.
    assert [j["job_id"] for j in shown["jobs"]] == ["backfill-aaa", "follow-bbb"]
    assert [j["shown_state"] for j in shown["jobs"]] == ["failed", "interrupted"]
    recorded = {k: v for k, v in shown["jobs"][0].items() if k != "shown_state"}
    assert msgspec.convert(recorded, JobProgress) == failed
    assert shown["bad_records"] == []

    code, output = blockx_offline("jobs", "nobody", "--sink-db", url, tmp_path=tmp_path)
    assert (code, f"no job 'nobody' in sqlite:///{tmp_path}/sink.db" in output) == (1, True)


def test_a_sink_that_is_not_there_is_one_line_and_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    code, output = blockx_offline("jobs", "--sink-db", f"sqlite:///{missing}", tmp_path=tmp_path)
    assert (code, f"no sink database at {missing}" in output) == (3, True), output
    assert not missing.exists()
    code, output = blockx_offline("jobs", tmp_path=tmp_path)
    assert code == 2
    assert "no sink database: pass --sink-db, set SINK_DB_URL, or start `blockx dev up`" in output
