"""The demo's backfill stage: the block range through the bundle cluster into the sink,
with ``blockx_drive.backfill`` as a user runs it.

The driver cuts the range into ``BlockBundleCallConfig`` tasks, runs at most
``tasks_in_flight`` at a time with ``BlockBundleWriteResultHandler`` into the sink
table, and re-runs a retryable failure under a new task_id of its lineage. The
progress bar follows its events: one per finished attempt, with the running
blocks/s, rows/s, tasks done and ETA.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import assert_never

import msgspec
from rich.console import Console

from blockx_cli.devcluster.demo.chain import progress_bar
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_client import Client
from blockx_drive import (
    BackfillDone,
    BackfillEvent,
    BackfillPlanned,
    TaskFinished,
    TaskOutcome,
    backfill,
)


class BackfillFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the driver's closing event reports, and the attempts that failed for good."""

    done: BackfillDone
    failed: list[str]


def _rate(event: TaskFinished, planned: BackfillPlanned) -> str:
    eta = "-" if event.eta_s is None else f"{event.eta_s:,.1f} s"
    return (
        f"{event.blocks_per_s:,.0f} blocks/s, {event.rows_per_s:,.0f} rows/s, "
        f"tasks {event.tasks_done}/{planned.tasks}, ETA {eta}"
    )


async def backfill_stage(
    client: Client,
    job: ChainJob,
    first: int,
    last: int,
    *,
    sink_db_url: str,
    block_db_url: str,
    console: Console,
    tasks: int = 8,
    tasks_in_flight: int = 4,
    bundle_size: int = 50,
) -> BackfillFigures:
    """Blocks ``first``..``last`` of ``job`` in about ``tasks`` tasks, with progress."""
    events: AsyncIterator[BackfillEvent] = backfill(
        client,
        job.spec(db_url=block_db_url, sink_db_url=sink_db_url, tasks_in_flight=tasks_in_flight),
        from_block=first,
        to_block=last,
        blocks_per_task=-(-(last - first + 1) // max(tasks, 1)),
        bundle_size=bundle_size,
    )
    failed: list[str] = []
    done: BackfillDone | None = None
    with progress_bar(console) as progress:
        bar = progress.add_task("blocks written", total=last - first + 1, rate="")
        planned: BackfillPlanned | None = None
        async for event in events:
            match event:
                case BackfillPlanned():
                    planned = event
                    progress.update(bar, total=event.blocks, rate=f"tasks 0/{event.tasks}")
                case TaskFinished():
                    assert planned is not None  # the plan is the first event
                    if event.outcome is TaskOutcome.FAILED:
                        failed.append(
                            f"{event.task_id}: {event.failure_code} {event.failure_message}"
                        )
                    elif event.outcome is TaskOutcome.RETRYING:
                        progress.console.print(
                            f"  [yellow]retrying[/] blocks {event.from_block}..{event.to_block}"
                            f" ({event.failure_code})"
                        )
                    progress.update(bar, completed=event.blocks_done, rate=_rate(event, planned))
                case BackfillDone():
                    done = event
                case _:
                    assert_never(event)
    assert done is not None  # the driver's iteration ends with its summary
    return BackfillFigures(done=done, failed=failed)
