"""``backfill``: run a block range through the bundle cluster into a sink table.

The range is cut into BlockBundleCallConfig tasks of ``blocks_per_task`` blocks
(``plan``), of which at most ``tasks_in_flight`` run at a time. A task whose
attempt fails retryably (or whose fate the client could not learn: a Worker
killed, a connection cut) runs again under a new task_id of its lineage, after a
back-off (``blockx_client.resubmit``), up to ``max_attempts`` attempts. Every
finished attempt is reported as it ends; the iteration ends with the summary. A
task that failed for good is reported, and the backfill goes on with the other
tasks or (``on_failure="stop"``) ends there, the waits of the attempts under way
cancelled. A task whose attempts all went without an answer from the cluster
ends the backfill with ClusterUnreachable: the other tasks would fare no better.

Before any task goes out, the source table, the sink's declared column types and
the function are checked once (``blockx_client.submission``); the run then keeps
its job record in the sink (``blockx_client.jobs``), and its tasks' ids start with
the record's ``task_prefix`` (``<job_id>-<first block>``, retries
``.retry-<attempt>`` after it).

BlockX itself generates no tasks: this is a client, and the task model stays the
Coordinator/Worker one. Stopping the iteration early (``aclose``, cancellation:
Ctrl-C in ``blockx backfill``) cancels the attempts under way on their Workers
(best effort, within a few seconds) and then their waits; what they wrote stays
written and a re-run skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.store import BlockStore, open_store
from blockx_chain.url import BlockDbUrl
from blockx_client.backfill.plan import (
    DEFAULT_BLOCKS_PER_TASK,
    BackfillError,
    BackfillPlan,
    TaskRange,
    bundle_task,
    missing_block,
    plan,
    split,
)
from blockx_client.backfill.progress import (
    BackfillEvent,
    BackfillPlanned,
    Tally,
    TaskFinished,
    TaskOutcome,
)
from blockx_client.backfill.record import backfill_progress
from blockx_client.call_unit import unit_config
from blockx_client.job_progress import new_record, task_prefix
from blockx_client.jobs import JobKind, JobRecorder, new_job_id, now_ms
from blockx_client.ledger import canonical_hashes, planning_chain, written_hashes
from blockx_client.models import Task, TaskResult
from blockx_client.resubmit import (
    DEFAULT_MAX_ATTEMPTS,
    OnFailure,
    Verdict,
    attempt_task_id,
    check_attempts,
    out_of_reach,
    retry_delay_s,
    run_attempt,
    unanswered,
    verdict,
)
from blockx_client.submission import (
    as_url,
    call_command,
    check_function,
    check_sink,
    check_source,
    writer_config_for,
)

if TYPE_CHECKING:
    from blockx_client.client import Client

DEFAULT_TASKS_IN_FLIGHT = 4
DEFAULT_BACKFILL_WRITER = "BlockBundleWriteResultHandler"


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
    task range at a time so that a range of millions of blocks is never in memory."""
    ranges = split(from_block, to_block, blocks_per_task)
    run: list[TaskRange] = []
    skipped: list[TaskRange] = []
    for task_range in ranges:
        first, last = task_range.from_block, task_range.to_block
        canonical = await canonical_hashes(store, first, last)
        missing = missing_block(first, last, canonical)
        if missing is not None:
            head = await store.head()
            at = "nothing ingested" if head is None else f"its head is {head['number']}"
            raise BackfillError(
                f"block {missing} is not in the block database ({at}): ingest it "
                "first (blockx chain ingest) or lower --to"
            )
        written = await written_hashes(sink, sink_table, chain_id, first, last)
        part = plan([task_range], canonical, written, force=force)
        run.extend(part.run)
        skipped.extend(part.skipped)
    return BackfillPlan(
        from_block=from_block, to_block=to_block, run=tuple(run), skipped=tuple(skipped)
    )


class _Attempt:
    __slots__ = ("attempt", "original", "range", "started", "task")

    def __init__(self, task_range: TaskRange, task: Task, original: str, attempt: int) -> None:
        self.range = task_range
        self.task = task
        self.original = original
        self.attempt = attempt
        self.started = 0.0


async def _run(client: Client, attempt: _Attempt) -> TaskResult:
    await asyncio.sleep(retry_delay_s(attempt.attempt))
    attempt.started = time.monotonic()
    return await run_attempt(client, attempt.task, attempt.original, attempt.attempt)


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
    *,
    function: str,
    source_table: str,
    from_block: int,
    to_block: int,
    sink_table: str,
    db_url: str | BlockDbUrl,
    sink_db_url: str | BlockDbUrl,
    where: Mapping[str, Any] | None = None,
    unit: str = "row",
    blocks_per_task: int = DEFAULT_BLOCKS_PER_TASK,
    bundle_size: int | None = None,
    tasks_in_flight: int = DEFAULT_TASKS_IN_FLIGHT,
    writer: str = DEFAULT_BACKFILL_WRITER,
    writer_config: Mapping[str, Any] | None = None,
    force: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    on_failure: OnFailure | str = OnFailure.CONTINUE,
    command: str | None = None,
    chain: str | None = None,
    abi: str | None = None,
    event: str | None = None,
) -> AsyncIterator[BackfillEvent]:
    """Backfill ``[from_block, to_block]``: ``function`` over ``source_table`` of the
    block database (``db_url``) into ``sink_table`` of the sink (``sink_db_url``,
    the one the bundle Workers write, SINK_DB_URL). Yields a BackfillPlanned, a
    TaskFinished per finished attempt, and a BackfillDone last. ``writer_config``
    adds writer options (``key``, ``columns``) to ``{"table": sink_table}``. A task
    is attempted at most ``max_attempts`` times; after one failed for good the
    backfill goes on (``on_failure="continue"``) or ends (``"stop"``).

    ``chain``: the name of the chain the tasks read (the Workers' ``[chains.NAME]``;
    None: their only chain); ``db_url`` is that chain's block database. The plan
    reads the ledger of its chain id only, the writers are told it (a Worker whose
    chain has another chain id refuses the tasks), and the rows written are that
    chain's, beside other chains' rows of the same table.

    ``unit``: ``row`` (a call per row), ``block`` (a call per block) or ``event``
    (a call per log of ``source_table`` ``logs`` that decodes as the event named
    ``event`` of the registered ABI named ``abi``, with ``{"block", "log",
    "event"}``). An ABI or event the block database's registry does not hold fails
    the tasks, not retryable: they are reported failed, not attempted again.

    Before any task goes out, the source table, the sink's column types and the
    function are checked (``blockx_client.submission``). The run keeps its job
    record in the sink (``blockx_client.jobs``), naming ``command`` (default: this
    call) as what started it; its tasks' ids start with the record's
    ``task_prefix``.

    Raises ValueError for arguments it cannot use (SubmissionRefused for a failed
    check), BackfillError when a block of the range is not in the block database,
    the stores' unavailable errors when a database cannot be reached,
    ClusterUnreachable (a ConnectError) when a task's attempts never reached the
    cluster, and InvalidRequestError when the cluster refuses the task (no bundle
    coordinator configured)."""
    units = unit_config(unit, source_table, abi, event)
    if tasks_in_flight < 1:
        raise ValueError(f"tasks_in_flight must be >= 1, got {tasks_in_flight}")
    after_failure = check_attempts(max_attempts, on_failure)
    if bundle_size is not None and bundle_size < 1:
        raise ValueError(f"bundle_size must be >= 1, got {bundle_size}")
    config = writer_config_for(writer_config, sink_table)
    check_source(source_table, where)
    block_db, sink_db = as_url(db_url, "db_url"), as_url(sink_db_url, "sink_db_url")
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
        if command is None:
            command = call_command(
                "backfill",
                {
                    "function": function,
                    "source_table": source_table,
                    "where": where,
                    "unit": unit,
                    "from_block": from_block,
                    "to_block": to_block,
                    "sink_table": sink_table,
                    "db_url": block_db,
                    "sink_db_url": sink_db,
                    "writer_config": writer_config,
                    "force": force or None,
                    "chain": chain,
                    "abi": abi,
                    "event": event,
                },
            )
        job_id = new_job_id(JobKind.BACKFILL)
        first = new_record(
            JobKind.BACKFILL,
            job_id=job_id,
            command=command,
            function=function,
            source_table=source_table,
            sink_table=sink_table,
            chain=chain,
            chain_id=chain_id,
            now_ms=now_ms(),
        )
        tasks = [
            bundle_task(
                task_range,
                function=function,
                source_table=source_table,
                where=where,
                unit=units,
                bundle_size=bundle_size,
                writer=writer,
                writer_config=config,
                chain=chain,
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
        pending = deque(
            _Attempt(task_range, task, f"{task_prefix(job_id)}{task_range.from_block}", 1)
            for task_range, task in zip(planned.run, tasks, strict=True)
        )
        record = backfill_progress(first, header, now_ms())
        tally = Tally(header, started)
        run = _backfill(client, tally, pending, tasks_in_flight, max_attempts, after_failure)
        async with JobRecorder(sink, record) as recorder, contextlib.aclosing(run) as events:
            async for happened in events:
                recorder.update(backfill_progress(recorder.record, happened, now_ms()))
                yield happened
    finally:
        await sink.close()


async def _backfill(
    client: Client,
    tally: Tally,
    pending: deque[_Attempt],
    tasks_in_flight: int,
    max_attempts: int,
    after_failure: OnFailure,
) -> AsyncGenerator[BackfillEvent, None]:
    """The plan, then the attempts, at most ``tasks_in_flight`` at a time, with
    the retryable ones resubmitted; a TaskFinished per finished attempt, the
    summary last."""
    yield tally.planned
    running: dict[asyncio.Task[TaskResult], _Attempt] = {}
    stopped = False  # a task failed for good and on_failure is STOP
    try:
        while (pending or running) and not stopped:
            while pending and len(running) < tasks_in_flight:
                attempt = pending.popleft()
                running[asyncio.create_task(_run(client, attempt))] = attempt
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for finished in sorted(done, key=lambda t: running[t].range.from_block):
                attempt = running.pop(finished)
                result = finished.result()  # InvalidRequestError ends the backfill
                event = _finished(attempt, result, max_attempts)
                if event.outcome is TaskOutcome.RETRYING:
                    # Next in line, so a range is not left behind the rest.
                    pending.appendleft(
                        _Attempt(attempt.range, attempt.task, attempt.original, attempt.attempt + 1)
                    )
                yield tally.record(event, time.monotonic())
                if event.outcome is TaskOutcome.FAILED:
                    if unanswered(result):
                        what = f"blocks {event.from_block}..{event.to_block}"
                        raise out_of_reach(what, event.attempt, result)
                    # The attempts under way are cancelled below; the summary
                    # counts the tasks this leaves unfinished.
                    stopped = after_failure is OnFailure.STOP
    finally:
        if running:
            # Nobody will wait for these: stop them on their Workers first.
            await client.cancel_in_flight(
                attempt_task_id(a.original, a.attempt) for a in running.values()
            )
        for waiting in running:
            waiting.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    yield tally.summary(time.monotonic())


def _finished(attempt: _Attempt, result: TaskResult, max_attempts: int) -> TaskFinished:
    judged = verdict(result)
    blocks = rows = 0
    if judged is Verdict.DONE:
        outcome = TaskOutcome.WRITTEN
        blocks, rows = _written_counts(result, attempt.range)
    elif judged is Verdict.RETRY and attempt.attempt < max_attempts:
        outcome = TaskOutcome.RETRYING
    else:
        outcome = TaskOutcome.FAILED
    return TaskFinished(
        task_id=result.task_id,
        original_task_id=attempt.original,
        attempt=attempt.attempt,
        from_block=attempt.range.from_block,
        to_block=attempt.range.to_block,
        outcome=outcome,
        blocks=blocks,
        rows=rows,
        failure_code=result.failure_code,
        failure_message=result.failure_message or result.error,
        seconds=time.monotonic() - attempt.started if attempt.started else 0.0,
    )
