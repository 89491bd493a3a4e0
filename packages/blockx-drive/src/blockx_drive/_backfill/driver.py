"""``backfill``: run a block range through the bundle cluster into a sink table.

The range is cut into BlockBundleCallConfig tasks of ``blocks_per_task`` blocks
(``plan``), of which at most ``tasks_in_flight`` run at a time. A task whose
attempt fails retryably (or whose fate the client could not learn: a Worker
killed, a connection cut) runs again under a new task_id of its lineage, after a
back-off, up to ``max_attempts`` attempts: the attempt book and pump of
``blockx_client.attempts`` decide and run them, ``blockx_drive.attempts`` says
what a driver does after a failure. Every finished attempt is reported as it
ends; the iteration ends with the summary. A
task that failed for good is reported, and the backfill goes on with the other
tasks or (``on_failure="stop"``) ends there, the waits of the attempts under way
cancelled. A task whose attempts all went without an answer from the cluster
ends the backfill with ClusterUnreachable: the other tasks would fare no better.

Before any task goes out, the source table, the sink's declared column types and
the function are checked once (``blockx_drive.submission``); the run then keeps
its job record in the sink (``blockx_drive.jobs``), and its tasks' ids start with
the record's ``task_prefix`` (``<job_id>-<first block>``, retries
``.retry-<attempt>`` after it).

BlockX itself generates no tasks: this is a client, and the task model stays the
Coordinator/Worker one. Stopping the iteration early (``aclose``, cancellation:
Ctrl-C in ``blockx backfill``) cancels the attempts under way on their Workers
(best effort, within a few seconds) and then their waits; what they wrote stays
written and a re-run skips it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, assert_never

from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.store import BlockStore, open_store
from blockx_client.attempts import (
    Attempt,
    AttemptBook,
    AttemptPump,
    Failed,
    Judgement,
    Retrying,
    Succeeded,
)
from blockx_client.models import TaskResult
from blockx_drive._backfill.plan import (
    BackfillError,
    BackfillPlan,
    TaskRange,
    bundle_task,
    check_range,
    missing_block,
    plan,
    split,
)
from blockx_drive._backfill.progress import (
    BackfillEvent,
    BackfillPlanned,
    Tally,
    TaskFinished,
    TaskOutcome,
)
from blockx_drive._backfill.record import backfill_progress
from blockx_drive.attempts import out_of_reach, run_attempt, unanswered
from blockx_drive.defaults import (
    DEFAULT_BACKFILL_WRITER,
    DEFAULT_BLOCKS_PER_TASK,
    OnFailure,
    default_bundle_size,
)
from blockx_drive.job_progress import new_record, task_prefix
from blockx_drive.jobs import JobKind, JobRecorder, new_job_id, now_ms
from blockx_drive.ledger import (
    canonical_hashes,
    catch_up_lake,
    planning_chain,
    written_hashes,
)
from blockx_drive.spec import JobSpec, check, command_of
from blockx_drive.submission import check_function, check_sink

if TYPE_CHECKING:
    from blockx_client import Client


async def make_plan(
    store: BlockStore,
    sink: SinkStore,
    *,
    chain_id: int,
    sink_table: str,
    from_block: int,
    to_block: int,
    blocks_per_task: int,
    force: bool,
) -> BackfillPlan:
    """The plan, from the block database's hashes and the sink's ledger, read one
    task range at a time so that a range of millions of blocks is never in memory.
    A range past the database's head is refused before it is split: its ranges
    would be made for blocks that do not exist, as many as ``--to`` asks."""
    check_range(from_block, to_block)
    head = await store.head()
    held = -1 if head is None else head["number"]  # the highest block held
    if to_block > held:
        raise _not_ingested(max(from_block, held + 1), head)
    ranges = split(from_block, to_block, blocks_per_task)
    run: list[TaskRange] = []
    skipped: list[TaskRange] = []
    for task_range in ranges:
        first, last = task_range.from_block, task_range.to_block
        canonical = await canonical_hashes(store, first, last)
        missing = missing_block(first, last, canonical)
        if missing is not None:
            raise _not_ingested(missing, await store.head())
        written = await written_hashes(sink, sink_table, chain_id, first, last)
        part = plan([task_range], canonical, written, force=force)
        run.extend(part.run)
        skipped.extend(part.skipped)
    return BackfillPlan(
        from_block=from_block, to_block=to_block, run=tuple(run), skipped=tuple(skipped)
    )


def _not_ingested(missing: int, head: Mapping[str, Any] | None) -> BackfillError:
    at = "nothing ingested" if head is None else f"its head is {head['number']}"
    return BackfillError(
        f"block {missing} is not in the block database ({at}): ingest it "
        "first (blockx chain ingest) or lower --to"
    )


def _written_counts(result: TaskResult, task_range: TaskRange) -> tuple[int, int]:
    """Blocks and rows from the writer's output (``{"blocks", "rows", ...}``); a
    writer that reports no counts is taken to have written the range's blocks."""
    value: Any = None
    if result.plugin_results:
        try:
            value = result.plugin_results[0].value()
        except ValueError:
            value = None
    if not isinstance(value, dict):
        return task_range.blocks, 0
    blocks = value.get("blocks", task_range.blocks)
    rows = value.get("rows", 0)
    return (
        blocks if isinstance(blocks, int) else task_range.blocks,
        rows if isinstance(rows, int) else 0,
    )


async def backfill(
    client: Client,
    job: JobSpec,
    *,
    from_block: int,
    to_block: int,
    blocks_per_task: int = DEFAULT_BLOCKS_PER_TASK,
    bundle_size: int | None = None,
    force: bool = False,
) -> AsyncIterator[BackfillEvent]:
    """Backfill ``[from_block, to_block]`` of ``job`` (``blockx_drive.JobSpec``: the
    function, the source table of the block database, the sink table and the
    rest), ``blocks_per_task`` blocks a task (of ``bundle_size`` blocks a bundle; None:
    the task's blocks are one bundle, ``defaults.default_bundle_size``).
    Yields a BackfillPlanned, a TaskFinished per finished attempt, and a
    BackfillDone last. Ranges the sink's ledger already holds under the block
    database's current hashes are skipped, unless ``force``.

    The plan reads the ledger of ``job.chain``'s chain id only, the writers are
    told it (a Worker whose chain has another chain id refuses the tasks), and the
    rows written are that chain's, beside other chains' rows of the same table. An
    ABI or event the block database's registry does not hold fails the tasks, not
    retryable: they are reported failed, not attempted again.

    Before any task goes out, the source table, the sink's column types and the
    function are checked (``blockx_drive.submission``). The run keeps its job
    record in the sink (``blockx_drive.jobs``), naming ``job.command`` (default:
    this call) as what started it; its tasks' ids start with the record's
    ``task_prefix``.

    Raises ValueError for arguments it cannot use (SubmissionRefused for a failed
    check), BackfillError when a block of the range is not in the block database,
    the stores' unavailable errors when a database cannot be reached,
    ClusterUnreachable (a ConnectError) when a task's attempts never reached the
    cluster, and InvalidRequestError when the cluster refuses the task (no bundle
    coordinator configured)."""
    checked = check(job, writer=DEFAULT_BACKFILL_WRITER)
    if bundle_size is not None and bundle_size < 1:
        raise ValueError(f"bundle_size must be >= 1, got {bundle_size}")
    config = checked.writer_config
    block_db, sink_db = checked.block_db, checked.sink_db
    function, source_table, sink_table = job.function, job.source_table, job.sink_table
    started = time.monotonic()
    store = await open_store(block_db, read_only=True)
    try:
        sink = await open_sink(sink_db)
    except BaseException:
        await store.close()
        raise
    try:
        try:
            await check_sink(sink, sink_table, config)
            unchecked = await check_function(client, function)
            chain_id = await planning_chain(store, sink)
            await catch_up_lake(sink_db, sink_table)
            planned = await make_plan(
                store,
                sink,
                chain_id=chain_id,
                sink_table=sink_table,
                from_block=from_block,
                to_block=to_block,
                blocks_per_task=blocks_per_task,
                force=force,
            )
            # A Worker whose sink is another database refuses the tasks (PLUGIN_FAILED).
            config["sinkIdentity"] = await sink.identity()
            # A Worker whose task chain is another chain refuses them too.
            config["chainId"] = chain_id
        finally:
            await store.close()
        command = command_of(
            job,
            checked,
            "backfill",
            (
                *("function", "source_table", "where", "unit", "from_block", "to_block"),
                *("sink_table", "db_url", "sink_db_url", "writer_config", "force"),
                *("chain", "abi", "event"),
            ),
            {"from_block": from_block, "to_block": to_block, "force": force or None},
        )
        job_id = new_job_id(JobKind.BACKFILL)
        first = new_record(
            JobKind.BACKFILL,
            job_id=job_id,
            command=command,
            function=function,
            source_table=source_table,
            sink_table=sink_table,
            chain=job.chain,
            chain_id=chain_id,
            now_ms=now_ms(),
        )
        tasks = [
            bundle_task(
                task_range,
                function=function,
                source_table=source_table,
                where=job.where,
                unit=checked.unit,
                bundle_size=default_bundle_size(blocks_per_task)
                if bundle_size is None
                else bundle_size,
                writer=checked.writer,
                writer_config=config,
                chain=job.chain,
            )
            for task_range in planned.run
        ]
        header = BackfillPlanned(
            job_id=job_id,
            from_block=planned.from_block,
            to_block=planned.to_block,
            tasks=len(planned.run),
            blocks=sum(r.blocks for r in planned.run),
            skipped_tasks=len(planned.skipped),
            skipped_blocks=sum(r.blocks for r in planned.skipped),
            function_unchecked=unchecked,
        )
        book = AttemptBook(max_attempts=job.max_attempts)
        pump = AttemptPump[TaskRange](
            book,
            run=functools.partial(run_attempt, client),
            cancel=client.cancel_in_flight,
            in_flight=job.tasks_in_flight,
        )
        pending = deque(
            (
                task_range,
                pump.open(
                    task_range.from_block, task, f"{task_prefix(job_id)}{task_range.from_block}"
                ),
            )
            for task_range, task in zip(planned.run, tasks, strict=True)
        )
        record = backfill_progress(first, header, now_ms())
        tally = Tally(header, started)
        run = _backfill(pump, tally, pending, checked.on_failure)
        async with JobRecorder(sink, record) as recorder, contextlib.aclosing(run) as events:
            async for happened in events:
                recorder.update(backfill_progress(recorder.record, happened, now_ms()))
                yield happened
    finally:
        await sink.close()


async def _backfill(
    pump: AttemptPump[TaskRange],
    tally: Tally,
    pending: deque[tuple[TaskRange, Attempt]],
    after_failure: OnFailure,
) -> AsyncGenerator[BackfillEvent, None]:
    """The plan, then the attempts, as many at a time as the pump runs, with the
    retryable ones resubmitted; a TaskFinished per finished attempt, the summary
    last."""
    yield tally.planned
    stopped = False  # a task failed for good and on_failure is STOP
    try:
        while (pending or len(pump)) and not stopped:
            while pending and pump.room > 0:
                pump.start(*pending.popleft())
            # InvalidRequestError ends the backfill.
            for finished in await pump.wait():
                judged = pump.judge(finished.attempt, finished.result)
                event = _finished(finished.item, judged, finished.seconds)
                if isinstance(judged, Retrying):
                    # Next in line, so a range is not left behind the rest.
                    pending.appendleft((finished.item, judged.next))
                yield tally.record(event, time.monotonic())
                if isinstance(judged, Failed):
                    if unanswered(judged.result):
                        what = f"blocks {event.from_block}..{event.to_block}"
                        raise out_of_reach(what, event.attempt, judged.result)
                    # The attempts under way are cancelled below; the summary
                    # counts the tasks this leaves unfinished.
                    stopped = after_failure is OnFailure.STOP
    finally:
        await pump.aclose()
    yield tally.summary(time.monotonic())


def _finished(task_range: TaskRange, judged: Judgement, seconds: float) -> TaskFinished:
    blocks = rows = 0
    match judged:
        case Succeeded():
            outcome = TaskOutcome.WRITTEN
            blocks, rows = _written_counts(judged.result, task_range)
        case Retrying():
            outcome = TaskOutcome.RETRYING
        case Failed():
            outcome = TaskOutcome.FAILED
        case unexpected:
            assert_never(unexpected)
    result = judged.result
    return TaskFinished(
        task_id=result.task_id,
        original_task_id=judged.attempt.original_task_id,
        attempt=judged.attempt.number,
        from_block=task_range.from_block,
        to_block=task_range.to_block,
        outcome=outcome,
        blocks=blocks,
        rows=rows,
        failure_code=result.failure_code or "",
        failure_message=result.failure_message or result.error,
        seconds=seconds,
    )
