"""Job records in a real etcd: ``JobPublisher`` writes them under a lease,
``list_jobs`` reads them, ``published`` folds a driver's events into them."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import free_port, wait_until

from blockx_client.backfill.progress import (
    BackfillDone,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
)
from blockx_client.errors import ConnectError
from blockx_client.follow.events import BlockFailed, BlockWritten, FollowEvent, FollowStarted
from blockx_client.job_progress import backfill_progress, follow_progress, published
from blockx_client.jobs import (
    FINISHED_TTL_S,
    RUNNING_TTL_S,
    JobKind,
    JobProgress,
    JobPublisher,
    JobState,
    list_jobs,
)
from blockx_server.etcd.local import EtcdServer


def _prefix() -> str:
    return f"/blockx/test-jobs/{uuid.uuid4().hex[:8]}/"


def _post(endpoint: str, path: str, body: dict[str, str]) -> Any:
    request = urllib.request.Request(
        f"http://{endpoint}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _lease_ttl(endpoint: str, key: str) -> int:
    """The granted TTL of the lease ``key`` is bound to (0: no lease)."""
    found = _post(endpoint, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
    lease = int(found["kvs"][0].get("lease", 0))
    if not lease:
        return 0
    return int(_post(endpoint, "/v3/lease/timetolive", {"ID": str(lease)})["grantedTTL"])


def _record(publisher: JobPublisher, **fields: Any) -> JobProgress:
    fields.setdefault("state", JobState.RUNNING)
    return JobProgress(
        job_id=publisher.job_id, kind=publisher.kind, started_ms=1, updated_ms=1, **fields
    )


async def test_a_running_job_is_listed_under_a_short_lease_and_kept_longer_when_done(
    etcd_server: EtcdServer,
) -> None:
    prefix, endpoint = _prefix(), etcd_server.endpoint
    async with JobPublisher([endpoint], JobKind.BACKFILL, prefix=prefix, interval_s=0.05) as pub:
        await pub.publish(_record(pub, blocks_done=3, blocks_total=10))

        async def listed() -> bool:
            return any(j.blocks_done == 3 for j in await list_jobs([endpoint], prefix=prefix))

        await wait_until(listed, "the running job's record")
        assert _lease_ttl(endpoint, pub.key) == RUNNING_TTL_S
        await pub.publish(_record(pub, state=JobState.DONE, blocks_done=10, blocks_total=10))
    [job] = await list_jobs([endpoint], prefix=prefix)
    assert (job.job_id, job.kind, job.state, job.blocks_done) == (
        pub.job_id,
        JobKind.BACKFILL,
        JobState.DONE,
        10,
    )
    assert pub.key == f"{prefix}backfill/{pub.job_id}"
    assert _lease_ttl(endpoint, pub.key) == FINISHED_TTL_S


async def test_a_job_that_ends_in_an_exception_is_recorded_failed(etcd_server: EtcdServer) -> None:
    prefix, endpoint = _prefix(), etcd_server.endpoint
    pub = JobPublisher([endpoint], JobKind.FOLLOW, prefix=prefix)

    async def job_that_breaks() -> None:
        async with pub:
            await pub.publish(_record(pub, last_block=7))
            raise RuntimeError("sink is gone")

    with pytest.raises(RuntimeError):
        await job_that_breaks()
    [job] = await list_jobs([endpoint], prefix=prefix)
    assert job.state is JobState.FAILED
    assert "sink is gone" in job.message
    assert job.last_block == 7


async def test_list_jobs_skips_what_is_not_a_job_and_sorts_newest_first(
    etcd_server: EtcdServer,
) -> None:
    prefix, endpoint = _prefix(), etcd_server.endpoint
    for job_id, started in (("old", 1), ("new", 5)):
        value = json.dumps(
            {
                "job_id": job_id,
                "kind": "follow",
                "state": "running",
                "started_ms": started,
                "updated_ms": started,
            }
        )
        _post(
            endpoint,
            "/v3/kv/put",
            {
                "key": base64.b64encode(f"{prefix}follow/{job_id}".encode()).decode(),
                "value": base64.b64encode(value.encode()).decode(),
            },
        )
    _post(
        endpoint,
        "/v3/kv/put",
        {
            "key": base64.b64encode(f"{prefix}follow/junk".encode()).decode(),
            "value": base64.b64encode(b"{not json").decode(),
        },
    )
    assert [j.job_id for j in await list_jobs([endpoint], prefix=prefix)] == ["new", "old"]


async def test_an_unreachable_etcd_neither_blocks_nor_fails_the_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="blockx_client.jobs"):
        async with JobPublisher([dead], JobKind.BACKFILL, interval_s=0.01, timeout_s=0.5) as pub:
            for blocks in range(50):
                await pub.publish(_record(pub, blocks_done=blocks))
            await asyncio.sleep(0.1)
    warnings = [r for r in caplog.records if "cannot publish job" in r.getMessage()]
    assert len(warnings) == 1
    assert dead in warnings[0].getMessage()
    with pytest.raises(ConnectError, match=dead):
        await list_jobs([dead], timeout_s=0.5)


async def _events(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def _task(outcome: TaskOutcome, from_block: int, to_block: int, **totals: Any) -> TaskFinished:
    return TaskFinished(
        task_id=f"t{from_block}",
        original_task_id=f"t{from_block}",
        attempt=1,
        from_block=from_block,
        to_block=to_block,
        outcome=outcome,
        blocks=to_block - from_block + 1 if outcome is TaskOutcome.WRITTEN else 0,
        rows=0,
        failure_message="" if outcome is TaskOutcome.WRITTEN else "boom",
        **totals,
    )


async def test_a_backfill_is_published_as_its_events_fold(etcd_server: EtcdServer) -> None:
    prefix, endpoint = _prefix(), etcd_server.endpoint
    events: list[BackfillEvent] = [
        BackfillPlanned(
            from_block=0, to_block=19, tasks=2, blocks=20, skipped_tasks=0, skipped_blocks=0
        ),
        _task(TaskOutcome.WRITTEN, 0, 9, blocks_done=10, rows_done=40, tasks_done=1, eta_s=1.5),
        _task(TaskOutcome.RETRYING, 10, 19, blocks_done=10, rows_done=40, tasks_done=1),
        BackfillDone(blocks=10, rows=40, tasks=2, failed=1, seconds=1.0, retries=1),
    ]
    async with JobPublisher([endpoint], JobKind.BACKFILL, prefix=prefix) as pub:
        seen = [e async for e in published(_events(events), pub, backfill_progress, function="f")]
    assert seen == events
    [job] = await list_jobs([endpoint], prefix=prefix)
    assert job.state is JobState.FAILED  # one task failed for good
    assert (job.from_block, job.to_block, job.blocks_total) == (0, 19, 20)
    assert (job.blocks_done, job.rows_done, job.retries, job.last_block) == (10, 40, 1, 9)
    assert (job.function, job.message) == ("f", "boom")


def test_follow_progress_tracks_the_head_and_its_lag() -> None:
    job = JobProgress(
        job_id="j", kind=JobKind.FOLLOW, state=JobState.RUNNING, started_ms=0, updated_ms=0
    )
    events: list[FollowEvent] = [
        FollowStarted(from_block=5, head=9, reorg_cursor=0),
        BlockWritten(
            number=5, hash="0x5", rows=2, task_id="a", attempt=1, lag_ms=900, seen_lag_ms=10
        ),
        BlockFailed(
            number=6,
            hash="0x6",
            task_id="b",
            attempt=3,
            failure_code="USER_ERROR",
            failure_message="x",
        ),
        BlockWritten(
            number=12, hash="0xc", rows=1, task_id="c", attempt=1, lag_ms=250, seen_lag_ms=5
        ),
    ]
    heads = []
    for at, event in enumerate(events, start=1):
        job = follow_progress(job, event, at)
        heads.append((job.head, job.last_block, job.head_lag_blocks))
    assert heads == [(9, None, None), (9, 5, 4), (9, 5, 4), (12, 12, 0)]
    assert (job.blocks_done, job.rows_done, job.tasks_failed, job.lag_ms, job.updated_ms) == (
        2,
        3,
        1,
        250,
        4,
    )
    assert job.message == "block 6: USER_ERROR: x"


async def test_a_follow_that_stops_as_asked_is_recorded_done(etcd_server: EtcdServer) -> None:
    prefix, endpoint = _prefix(), etcd_server.endpoint
    started = FollowStarted(from_block=0, head=3, reorg_cursor=0)
    async with JobPublisher([endpoint], JobKind.FOLLOW, prefix=prefix) as pub:
        [_ async for _ in published(_events([started]), pub, follow_progress)]
    [job] = await list_jobs([endpoint], prefix=prefix)
    assert (job.state, job.head) == (JobState.DONE, 3)
