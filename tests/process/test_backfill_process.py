"""``blockx backfill`` on a real bundle cluster (a ``blockx-bundle-coordinator`` and a
``blockx-bundle-worker`` over a SQLite block database and sink): the sink ends up
with exactly the rows computed independently from the chain, a Worker killed with
SIGKILL mid-run and restarted leaves no block missing or doubled, a re-run skips
everything and ``--force`` rewrites it; flag and database errors are one line and
an exit code."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_cluster import ChainCluster
from chain_rows import CHAIN_ID, block_hash, make_block, seed_chain
from processes import SyncInvokerProcess
from support import free_port, wait_until
from typer.testing import CliRunner

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_chain.sink import open_sink, read_identity
from blockx_chain.url import parse_blockdb_url
from blockx_cli.app import app
from blockx_client import Client, RetryPolicy, TaskFilter, TaskState
from blockx_core.chains import DEFAULT_CHAIN
from blockx_core.registry import RegistryKind
from blockx_drive import BackfillDone, BackfillPlanned, JobSpec, TaskFinished, TaskOutcome, backfill
from blockx_drive.attempts import ClusterUnreachable
from blockx_drive.jobs import JobKind, JobProgress, JobState, list_jobs
from blockx_server.etcd.local import EtcdServer

FUNCTIONS = """
import time

def transfer(row):
    time.sleep(0.01)  # long enough for a task to be under way when its Worker dies
    return {"log_index": row["log_index"], "data": row["data"]}


def held(row):
    time.sleep(600)  # until the call is cancelled


def transfer_but_25(row):
    if row["block_number"] == 25:
        raise ValueError("block 25 is refused")
    return {"log_index": row["log_index"], "data": row["data"]}
"""
BLOCKS = 240
PER_TASK = 10
WHERE = json.dumps({"topic0": TRANSFER_TOPIC})
# Another chain writing the same sink tables.
BASE = 8453


class Setup:
    def __init__(
        self, cluster: ChainCluster, chain_url: str, sink_url: str, functions: Path
    ) -> None:
        self.cluster = cluster
        self.chain_url = chain_url
        self.sink_url = sink_url
        self.functions = functions

    def argv(
        self,
        table: str,
        *extra: str,
        to_block: int = BLOCKS - 1,
        function: str = "transfer",
        databases: bool = True,
        bundle_size: int | None = 5,
    ) -> list[str]:
        dbs = ["--db", self.chain_url, "--sink-db", self.sink_url] if databases else []
        bundle = [] if bundle_size is None else ["--bundle-size", str(bundle_size)]
        return [
            *self.cluster.cli_args(),
            "backfill",
            "--function",
            function,
            "--source-table",
            "logs",
            "--where",
            WHERE,
            "--from",
            "0",
            "--to",
            str(to_block),
            "--blocks-per-task",
            str(PER_TASK),
            *bundle,
            "--tasks-in-flight",
            "2",
            "--sink-table",
            table,
            *dbs,
            *extra,
        ]


@pytest.fixture(scope="module")
def setup(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("backfill")
    chain_url = f"sqlite:///{root}/chain.db"
    sink_url = f"sqlite:///{root}/sink.db"
    asyncio.run(seed_chain(chain_url, BLOCKS))
    functions = root / "functions"
    functions.mkdir()
    (functions / "transfers.py").write_text(FUNCTIONS)
    cluster = ChainCluster(
        etcd_server,
        root,
        RegistryKind.BUNDLE,
        chain_url=chain_url,
        sink_url=sink_url,
        functions=functions,
    )
    with cluster.serving():
        yield Setup(cluster, chain_url, sink_url, functions)


def expected_rows(blocks: range) -> list[tuple[Any, ...]]:
    """The rows the function gives, computed from the chain without BlockX."""
    return [
        (n, block_hash(n), index, log.log_index, log.data)
        for n in blocks
        for index, log in enumerate(
            log for log in make_block(n).logs if log.topic0 == TRANSFER_TOPIC
        )
    ]


async def sink_state(url: str, table: str) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        rows = await sink.rows(table)
        ledger = await sink.written(table, CHAIN_ID)
    finally:
        await sink.close()
    shaped = [
        (r["block_number"], r["block_hash"], r["row_index"], r["log_index"], r["data"])
        for r in rows
        if r["chain_id"] == CHAIN_ID
    ]
    return shaped, ledger


async def cli(argv: list[str], **env: str) -> asyncio.subprocess.Process:
    blockx = shutil.which("blockx")
    assert blockx is not None
    return await asyncio.create_subprocess_exec(
        blockx,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **env},
    )


async def json_lines(argv: list[str], **env: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = await cli(argv, **env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, [json.loads(line) for line in out.decode().splitlines()], err.decode()


async def test_a_worker_killed_mid_run_leaves_no_block_missing_or_doubled(setup: Setup) -> None:
    cluster = setup.cluster
    proc = await cli(setup.argv("transfers", "--json"))
    assert proc.stdout is not None
    events: list[dict[str, Any]] = []
    written = 0
    killed = False
    async with asyncio.timeout(150):
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            event = json.loads(line)
            events.append(event)
            if event["event"] == "task" and event["outcome"] == "written":
                written += 1
            if written == 3 and not killed:
                # Tasks are under way on the Worker: SIGKILL it, start it again.
                cluster.kill_worker()
                killed = True
                await cluster.restart_worker()
        err = (await proc.stderr.read()).decode() if proc.stderr else ""
        assert await proc.wait() == 0, err
    assert killed
    assert "Traceback" not in err
    done = events[-1]
    assert done["event"] == "done"
    assert (done["blocks"], done["rows"], done["tasks"], done["failed"]) == (
        BLOCKS,
        2 * BLOCKS,
        BLOCKS // PER_TASK,
        0,
    )
    tasks = [e for e in events if e["event"] == "task"]
    retried = [e for e in tasks if e["outcome"] == "retrying"]
    assert retried, "the kill hit no task under way"
    # Each resubmission ran under a new task_id of its lineage.
    later = [e for e in tasks if e["attempt"] > 1]
    assert later
    assert all(e["task_id"] == f"{e['original_task_id']}.retry-{e['attempt']}" for e in later)
    assert sorted((e["from_block"], e["to_block"]) for e in tasks if e["outcome"] == "written") == [
        (a, a + PER_TASK - 1) for a in range(0, BLOCKS, PER_TASK)
    ]
    assert {"blocks_per_s", "rows_per_s", "eta_s", "tasks_done", "tasks_failed"} <= set(tasks[0])

    rows, ledger = await sink_state(setup.sink_url, "transfers")
    assert rows == expected_rows(range(BLOCKS))
    assert [(w["block_number"], w["block_hash"]) for w in ledger] == [
        (n, block_hash(n)) for n in range(BLOCKS)
    ]


async def test_one_bundle_a_task_by_default_writes_what_small_bundles_write(
    setup: Setup,
) -> None:
    """Without --bundle-size a task's blocks are one writer transaction: the same
    rows and ledger as bundles of 5 blocks."""
    written = {}
    for table, bundle_size in (("default_bundle", None), ("small_bundles", 5)):
        argv = setup.argv(table, "--json", bundle_size=bundle_size)
        code, events, err = await json_lines(argv)
        assert code == 0, err
        assert events[-1]["event"] == "done"
        assert events[-1]["blocks"] == BLOCKS
        rows, ledger = await sink_state(setup.sink_url, table)
        assert rows == expected_rows(range(BLOCKS))
        written[table] = sorted((e["block_number"], e["block_hash"]) for e in ledger)
    assert written["default_bundle"] == written["small_bundles"]
    assert len(written["default_bundle"]) == BLOCKS


async def test_sigint_stops_a_backfill_and_a_rerun_finishes_it(setup: Setup) -> None:
    # Each run keeps its job record in the sink it writes.
    sink_url = parse_blockdb_url(setup.sink_url)
    proc = await cli(setup.argv("stopped", "--json"))
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        plan = json.loads(await proc.stdout.readline())
        while True:
            event = json.loads(await proc.stdout.readline())
            if event["event"] == "task" and event["outcome"] == "written":
                break
        proc.send_signal(signal.SIGINT)
        out, err = await proc.communicate()
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    assert "done" not in {json.loads(line)["event"] for line in out.decode().splitlines()}
    _, ledger = await sink_state(setup.sink_url, "stopped")
    assert 0 < len(ledger) < BLOCKS
    [stopped] = await list_jobs(sink_url, job_id=plan["job_id"])
    assert (stopped.kind, stopped.state, stopped.sink_table, stopped.function) == (
        JobKind.BACKFILL,
        JobState.STOPPED,
        "stopped",
        "transfer",
    )
    assert (stopped.from_block, stopped.to_block, stopped.blocks_total) == (0, BLOCKS - 1, BLOCKS)
    assert 0 < stopped.blocks_done < BLOCKS
    assert stopped.ended_ms is not None
    assert stopped.command.startswith("blockx ")
    assert "backfill --function transfer" in stopped.command
    assert event["task_id"].startswith(stopped.task_prefix)

    code, events, err_text = await json_lines(setup.argv("stopped", "--json"))
    assert code == 0, err_text
    assert events[0]["skipped_tasks"] >= 1
    assert events[-1]["failed"] == 0
    rows, ledger = await sink_state(setup.sink_url, "stopped")
    assert rows == expected_rows(range(BLOCKS))
    assert [w["block_number"] for w in ledger] == list(range(BLOCKS))
    # A new record for the re-run; the stopped one stays as it ended.
    rerun_id = events[0]["job_id"]
    assert rerun_id != stopped.job_id
    [rerun] = await list_jobs(sink_url, job_id=rerun_id)
    assert (rerun.state, rerun.function, rerun.blocks_done) == (
        JobState.FINISHED,
        "transfer",
        events[-1]["blocks"],
    )
    assert rerun.blocks_total == rerun.blocks_done == BLOCKS - events[0]["skipped_blocks"]
    assert await list_jobs(sink_url, job_id=stopped.job_id) == [stopped]


async def test_a_rerun_skips_what_is_written_and_force_rewrites_it(setup: Setup) -> None:
    last = 4 * PER_TASK - 1
    async with setup.cluster.client() as client:
        first = [
            e
            async for e in backfill(
                client,
                JobSpec(
                    function="transfer",
                    source_table="logs",
                    where={"topic0": TRANSFER_TOPIC},
                    tasks_in_flight=2,
                    sink_table="again",
                    db_url=setup.chain_url,
                    sink_db_url=setup.sink_url,
                ),
                from_block=0,
                to_block=last,
                blocks_per_task=PER_TASK,
            )
        ]
        assert isinstance(first[0], BackfillPlanned)
        assert (first[0].tasks, first[0].skipped_tasks) == (4, 0)
        done = first[-1]
        assert isinstance(done, BackfillDone)
        assert (done.blocks, done.rows, done.tasks, done.failed) == (last + 1, 2 * (last + 1), 4, 0)
    rows, ledger = await sink_state(setup.sink_url, "again")
    assert rows == expected_rows(range(last + 1))

    code, events, err = await json_lines(setup.argv("again", "--json", to_block=last))
    assert code == 0, err
    assert events[0] == {
        "event": "plan",
        "job_id": events[0]["job_id"],
        "function_unchecked": events[0]["function_unchecked"],
        "from_block": 0,
        "to_block": last,
        "tasks": 0,
        "blocks": 0,
        "skipped_tasks": 4,
        "skipped_blocks": last + 1,
    }
    assert [e["event"] for e in events] == ["plan", "done"]
    assert (events[-1]["tasks"], events[-1]["skipped"], events[-1]["blocks"]) == (0, 4, 0)
    assert (await sink_state(setup.sink_url, "again"))[1] == ledger

    code, events, err = await json_lines(setup.argv("again", "--json", "--force", to_block=last))
    assert code == 0, err
    assert [e["event"] for e in events] == ["plan", "task", "task", "task", "task", "done"]
    assert events[-1]["tasks"] == 4
    rows_again, ledger_again = await sink_state(setup.sink_url, "again")
    assert rows_again == rows
    assert all(
        new["task_id"] != old["task_id"] for new, old in zip(ledger_again, ledger, strict=True)
    )


async def test_a_backfill_into_a_postgresql_sink(
    setup: Setup, etcd_server: EtcdServer, postgres_url: str, tmp_path: Path
) -> None:
    cluster = ChainCluster(
        etcd_server,
        tmp_path,
        RegistryKind.BUNDLE,
        chain_url=setup.chain_url,
        sink_url=postgres_url,
        functions=setup.functions,
    )
    try:
        await cluster.wait_ready()
        last = 3 * PER_TASK - 1
        async with cluster.client() as client:
            events = [
                e
                async for e in backfill(
                    client,
                    JobSpec(
                        function="transfer",
                        source_table="logs",
                        where={"topic0": TRANSFER_TOPIC},
                        sink_table="transfers",
                        db_url=setup.chain_url,
                        sink_db_url=postgres_url,
                    ),
                    from_block=0,
                    to_block=last,
                    blocks_per_task=PER_TASK,
                )
            ]
    finally:
        cluster.stop()
    done = events[-1]
    assert isinstance(done, BackfillDone)
    assert (done.blocks, done.tasks, done.failed) == (last + 1, 3, 0)
    rows, ledger = await sink_state(postgres_url, "transfers")
    assert rows == expected_rows(range(last + 1))
    assert [w["block_number"] for w in ledger] == list(range(last + 1))
    # Its job record is in that sink too.
    [job] = await list_jobs(parse_blockdb_url(postgres_url))
    assert (job.state, job.blocks_done, job.tasks_done) == (JobState.FINISHED, last + 1, 3)
    assert "db_url=" in job.command


async def test_a_backfill_given_another_sink_than_the_workers_fails_and_writes_nothing(
    setup: Setup, tmp_path: Path
) -> None:
    # The Workers write sink A (their SINK_DB_URL); the driver is given sink B.
    given = f"sqlite:///{tmp_path}/other-sink.db"
    async with setup.cluster.client() as client:
        events = [
            e
            async for e in backfill(
                client,
                JobSpec(
                    function="transfer",
                    source_table="logs",
                    sink_table="elsewhere",
                    db_url=setup.chain_url,
                    sink_db_url=given,
                    max_attempts=3,
                ),
                from_block=0,
                to_block=PER_TASK - 1,
            )
        ]
    finished = [e for e in events if isinstance(e, TaskFinished)]
    # Not retryable: one attempt of three, failed.
    assert [(e.outcome, e.attempt, e.failure_code) for e in finished] == [
        (TaskOutcome.FAILED, 1, "PLUGIN_FAILED")
    ]
    workers = await read_identity(parse_blockdb_url(setup.sink_url))
    drivers = await read_identity(parse_blockdb_url(given))
    assert workers != drivers
    assert workers in finished[0].failure_message
    assert drivers in finished[0].failure_message
    assert await sink_state(setup.sink_url, "elsewhere") == ([], [])
    assert await sink_state(given, "elsewhere") == ([], [])


async def test_a_cluster_out_of_reach_ends_the_backfill(setup: Setup) -> None:
    # Each attempt gives up on the unreachable coordinator after 0.5 s, not 10.
    nowhere, patience = f"127.0.0.1:{free_port()}", RetryPolicy(unreachable_s=0.5)
    async with Client(bundle_coordinator=nowhere, retry=patience) as client:
        events = backfill(
            client,
            JobSpec(
                function="transfer",
                source_table="logs",
                sink_table="unreached",
                db_url=setup.chain_url,
                sink_db_url=setup.sink_url,
                max_attempts=2,
            ),
            from_block=0,
            to_block=PER_TASK - 1,
        )
        seen: list[Any] = []

        async def consume() -> None:
            async for event in events:
                seen.append(event)

        with pytest.raises(ClusterUnreachable, match="2 attempts and the cluster never answered"):
            await consume()
    assert [type(e) for e in seen] == [BackfillPlanned, TaskFinished, TaskFinished]
    assert [e.outcome for e in seen[1:]] == [TaskOutcome.RETRYING, TaskOutcome.FAILED]


def test_bad_flags_and_unusable_databases_are_one_line_and_an_exit_code(
    setup: Setup, tmp_path: Path
) -> None:
    runner = CliRunner()

    def run(argv: list[str]) -> tuple[int, str]:
        # No dev.toml of a running `blockx dev up` to fall back on.
        env = {"COLUMNS": "200", "XDG_CONFIG_HOME": str(tmp_path)}
        result = runner.invoke(app, argv, env=env)
        assert result.exception is None or isinstance(result.exception, SystemExit), result
        return result.exit_code, result.output

    base = setup.argv("errors")
    bad_where = [
        *base[: base.index("--where") + 1],
        "{not json",
        *base[base.index("--where") + 2 :],
    ]
    code, output = run(bad_where)
    assert (code, "--where must be a JSON object" in output) == (2, True)
    code, output = run(
        [
            *setup.cluster.cli_args(),
            "backfill",
            "--function",
            "f",
            "--source-table",
            "logs",
            "--from",
            "9",
            "--to",
            "3",
            "--sink-table",
            "s",
            "--db",
            setup.chain_url,
            "--sink-db",
            setup.sink_url,
        ]
    )
    assert (code, "--to (3) is below --from (9)" in output) == (2, True)
    code, output = run([*base, "--blocks-per-task", "0"])
    assert (code, "--blocks-per-task" in output) == (2, True)
    for bad in (["--max-attempts", "0"], ["--max-attempts", "101"], ["--on-failure", "skip"]):
        code, output = run([*base, *bad])
        assert (code, bad[0] in output) == (2, True), output
    for column, message in (
        ("volume=FLOAT", "has type 'FLOAT', not one of INTEGER|TEXT|REAL|NUMERIC|JSON"),
        ("volume", "expected NAME=TYPE, TYPE one of INTEGER, TEXT, REAL, NUMERIC, JSON"),
        ("1x=TEXT", "is not a usable name"),
    ):
        code, output = run([*base, "--column", column])
        assert (code, message in output) == (2, True), output
    code, output = run([*base, "--column", "a=TEXT", "--column", "A=JSON"])
    assert (code, "--column 'A' is declared twice" in output) == (2, True), output
    no_db = [a for a in base if a not in ("--db", setup.chain_url)]
    code, output = run(no_db)
    assert (code, "no block database: pass --db, set BLOCKDB_URL" in output) == (2, True)
    code, output = run([*base, "--db", "mysql://x"])
    assert (code, "--db" in output) == (2, True)
    unreachable = [*base, "--db", "postgresql://blockx@127.0.0.1:1/nowhere"]
    code, output = run(unreachable)
    assert code == 3, output
    code, output = run(setup.argv("errors", to_block=BLOCKS + 5))
    assert (code, f"block {BLOCKS} is not in the block database" in output) == (1, True)
    # Refused before the range is split: its task ranges would not fit in memory.
    code, output = run(setup.argv("errors", to_block=10**15))
    assert (code, f"block {BLOCKS} is not in the block database" in output) == (1, True)
    code, output = run(setup.argv("errors", to_block=2**63))  # no block number
    assert (code, "--to" in output) == (2, True), output
    # Checked before any task goes out: a source table the block database lacks, a
    # declared type that is no widening of the sink's.
    misnamed = [*base[: base.index("logs")], "log", *base[base.index("logs") + 1 :]]
    code, output = run(misnamed)
    assert code == 2, output
    assert "source table 'log' is not a table of the block database" in output
    assert "Did you mean 'logs'?" in output
    asyncio.run(_typed_table(setup.sink_url))
    code, output = run([*setup.argv("typed"), "--column", "log_index=TEXT"])
    assert code == 2, output
    assert "column 'log_index' of table 'typed' is INTEGER, the writer declares TEXT" in output
    assert asyncio.run(sink_state(setup.sink_url, "errors")) == ([], [])
    follow_base = ["follow", "--function", "f", "--source-table", "logs", "--sink-table", "s"]
    follow_dbs = ["--db", setup.chain_url, "--sink-db", setup.sink_url]
    code, output = run([*follow_base, *follow_dbs, "--where", "[1]"])
    assert (code, "--where must be a JSON object" in output) == (2, True)
    code, output = run([*follow_base, *follow_dbs, "--from", "-1"])
    assert (code, "--from" in output) == (2, True)
    code, output = run([*follow_base, *follow_dbs, "--unit", "tx"])
    assert (code, "--unit" in output) == (2, True)
    code, output = run([*follow_base, *follow_dbs, "--poll-interval", "0"])
    assert (code, "--poll-interval" in output) == (2, True)
    for bad in (["--reorg-window", "0"], ["--reorg-window", "100001"], ["--max-attempts", "0"]):
        code, output = run([*follow_base, *follow_dbs, *bad])
        assert (code, bad[0] in output) == (2, True), output
    code, output = run([*follow_base, *follow_dbs, "--column", "v=FLOAT"])
    assert (code, "not one of INTEGER|TEXT|REAL|NUMERIC|JSON" in output) == (2, True), output
    follow_misnamed = [*follow_base[:4], "erc20_transfer", *follow_base[5:], *follow_dbs]
    code, output = run(follow_misnamed)
    assert (code, "Did you mean 'erc20_transfers'" in output) == (2, True), output
    result = runner.invoke(
        app,
        [*follow_base, "--db", setup.chain_url],
        env={"SINK_DB_URL": None, "COLUMNS": "200", "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert result.exit_code == 2
    assert (
        "no sink database: pass --sink-db, set SINK_DB_URL, or start `blockx dev up`"
        in result.output
    )
    # The bundle cluster's task with no bundle coordinator configured.
    no_bundle = base[2:]
    result = runner.invoke(
        app, no_bundle, env={"BLOCKX_BUNDLE_COORDINATOR": None, "COLUMNS": "200"}
    )
    assert result.exit_code == 2, result.output
    assert "no bundle coordinator is configured" in result.output
    assert "Traceback" not in result.output


async def _typed_table(url: str) -> None:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        await sink.replace_blocks("typed", CHAIN_ID, [(0, block_hash(0), [{"log_index": 1}])])
    finally:
        await sink.close()


async def test_a_misspelled_function_is_refused_before_any_task_goes_out(
    setup: Setup, tmp_path: Path
) -> None:
    invoker = SyncInvokerProcess(
        {"FUNCTIONS_DIR": str(setup.functions), "EXECUTOR_COUNT": "1"}, tmp_path / "invoker.log"
    )
    try:
        await invoker.wait_ready()
        checked = ["--sync-invoker", invoker.addr]
        code, events, err = await json_lines(
            [*checked, *setup.argv("misspelled", "--json", function="transfr")]
        )
        # One line, the code view's own "Did you mean", and nothing submitted.
        assert (code, events) == (2, []), err
        assert "FUNCTION_NOT_FOUND: function 'transfr' is not defined" in err
        assert "Did you mean 'transfer'" in err
        assert "Traceback" not in err
        async with setup.cluster.client() as client:
            listed = await client.list_tasks(workers=[setup.cluster.worker.addr])
        assert [t.task_id for t in listed.tasks if t.function == "transfr"] == []
        assert await sink_state(setup.sink_url, "misspelled") == ([], [])
        # Spelled right, the check passes and the run goes on.
        code, events, err = await json_lines(
            [*checked, *setup.argv("spelled", "--json", to_block=PER_TASK - 1)]
        )
        assert code == 0, err
        assert events[0]["function_unchecked"] == ""
    finally:
        invoker.stop()


def _invoke(argv: list[str], **env: str | None) -> tuple[int, list[dict[str, Any]], str]:
    """``blockx`` in this process: the exit code, the JSON lines, everything printed."""
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, lines, result.output


def sink_now(setup: Setup, table: str) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """``sink_state`` from a test without an event loop (one that runs the CLI)."""
    return asyncio.run(sink_state(setup.sink_url, table))


def test_a_backfill_told_to_stop_ends_at_the_first_failed_task(setup: Setup) -> None:
    argv = setup.argv(
        "stopping",
        *("--json", "--on-failure", "stop", "--max-attempts", "2", "--tasks-in-flight", "1"),
        function="transfer_but_25",
    )
    code, events, output = _invoke(argv)
    assert code == 1, output
    tasks = [e for e in events if e["event"] == "task"]
    # In block order, one at a time: 0..9 and 10..19 written, 20..29 fails (a call
    # failure is not retryable: one attempt), and nothing runs after it.
    assert [(e["from_block"], e["outcome"], e["attempt"]) for e in tasks] == [
        (0, "written", 1),
        (10, "written", 1),
        (20, "failed", 1),
    ]
    done = events[-1]
    assert (done["event"], done["failed"], done["unfinished"]) == (
        "done",
        1,
        BLOCKS // PER_TASK - 3,
    )
    assert "blocks 20..29 after 1 attempts: CALL_FAILED: call #" in output
    rows, _ = sink_now(setup, "stopping")
    assert rows == expected_rows(range(20))


def test_declared_columns_reach_the_writer(setup: Setup) -> None:
    argv = setup.argv("declared", "--column", "log_index=numeric", to_block=PER_TASK - 1)
    code, _, output = _invoke(argv)
    assert code == 0, output
    rows, _ = sink_now(setup, "declared")
    # NUMERIC, as declared (read back as decimal text), not the INTEGER inferred.
    assert rows == [
        (n, h, i, str(log_index), data) for n, h, i, log_index, data in expected_rows(range(10))
    ]


async def _other_chain_rows(url: str, table: str, blocks: range) -> None:
    """Another chain's rows and ledger entries for the same block numbers."""
    sink = await open_sink(parse_blockdb_url(url))
    try:
        await sink.replace_blocks(table, BASE, [(n, f"0xba5e{n}", [{"base": n}]) for n in blocks])
    finally:
        await sink.close()


def test_a_backfill_of_a_named_chain_writes_its_rows_beside_another_chains(
    setup: Setup,
) -> None:
    blocks = range(PER_TASK)
    asyncio.run(_other_chain_rows(setup.sink_url, "chained", blocks))
    argv = setup.argv("chained", "--json", "--chain", DEFAULT_CHAIN, to_block=PER_TASK - 1)
    code, events, output = _invoke(argv)
    assert code == 0, output
    # The other chain's ledger entries skip nothing: the plan reads this chain's.
    assert (events[0]["tasks"], events[0]["skipped_tasks"]) == (1, 0)
    rows, ledger = sink_now(setup, "chained")
    assert rows == expected_rows(blocks)
    assert [w["block_number"] for w in ledger] == list(blocks)
    everything = asyncio.run(_sink_rows(setup.sink_url, "chained"))
    assert {r["chain_id"] for r in everything} == {CHAIN_ID, BASE}
    assert [r["base"] for r in everything if r["chain_id"] == BASE] == list(blocks)
    job = asyncio.run(_job(setup.sink_url, events[0]["job_id"]))
    assert (job.chain, job.chain_id) == (DEFAULT_CHAIN, CHAIN_ID)


async def _sink_rows(url: str, table: str) -> list[dict[str, Any]]:
    sink = await open_sink(parse_blockdb_url(url))
    try:
        return await sink.rows(table)
    finally:
        await sink.close()


async def _job(url: str, job_id: str) -> JobProgress:
    [job] = [j for j in await list_jobs(parse_blockdb_url(url)) if j.job_id == job_id]
    return job


def test_the_databases_of_a_running_dev_up_are_used_below_flags_and_environment(
    setup: Setup, tmp_path: Path
) -> None:
    dev_toml = tmp_path / "blockx" / "dev.toml"
    dev_toml.parent.mkdir()
    dev_toml.write_text(
        f'BLOCKDB_URL = "{setup.chain_url}"\nSINK_DB_URL = "{setup.sink_url}"\n\n'
        f"[writer]\npid = {os.getpid()}\n"
    )
    home = {"XDG_CONFIG_HOME": str(tmp_path)}
    without_dbs = setup.argv("dev_toml", to_block=PER_TASK - 1, databases=False)
    # dev.toml alone: its databases.
    code, _, output = _invoke(without_dbs, BLOCKDB_URL=None, SINK_DB_URL=None, **home)
    assert code == 0, output
    assert f"from the running `blockx dev up` ({dev_toml})" in output
    rows, _ = sink_now(setup, "dev_toml")
    assert rows == expected_rows(range(PER_TASK))
    # The environment over dev.toml ...
    nowhere = f"sqlite:///{tmp_path}/missing/chain.db"
    code, _, output = _invoke(without_dbs, BLOCKDB_URL=nowhere, SINK_DB_URL=None, **home)
    assert (code, f"{tmp_path}/missing" in output) == (3, True), output
    # ... and the flag over the environment.
    flagged = [*without_dbs, "--db", setup.chain_url]
    code, _, output = _invoke(flagged, BLOCKDB_URL=nowhere, SINK_DB_URL=None, **home)
    assert code == 0, output
    # A bad value in dev.toml is named where it comes from.
    dev_toml.write_text(f'BLOCKDB_URL = "mysql://x"\n\n[writer]\npid = {os.getpid()}\n')
    code, _, output = _invoke([*without_dbs, "--sink-db", setup.sink_url], BLOCKDB_URL=None, **home)
    assert (code, f"BLOCKDB_URL in {dev_toml}" in output) == (2, True), output
    dev_toml.write_text("not = [toml")
    code, _, output = _invoke(without_dbs, BLOCKDB_URL=None, SINK_DB_URL=None, **home)
    assert (code, f"{dev_toml} is not valid TOML" in output) == (2, True), output
    assert "Traceback" not in output


async def test_sigint_cancels_the_tasks_in_flight_on_their_worker(setup: Setup) -> None:
    """Ctrl-C cancels the backfill's tasks in flight on the Worker before it exits, and
    says so; the cancelled calls' executors are the watchdog's (last: it kills them)."""
    worker = setup.cluster.worker.addr
    held = TaskFilter(function="held")
    proc = await cli(setup.argv("held", "--json", function="held", to_block=4 * PER_TASK - 1))
    try:
        async with Client(direct=True) as client:

            async def both_running() -> bool:
                assert proc.returncode is None
                found = await client.list_tasks(held, workers=[worker])
                return [t.state for t in found.tasks] == [TaskState.RUNNING] * 2

            await wait_until(both_running, "two tasks of the backfill running", timeout=60)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 130, err.decode()
            assert "interrupted: cancelling 2 task(s) in flight on their workers" in err.decode()
            found = await client.list_tasks(held, workers=[worker])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert [(t.state, t.failure_code, t.failure_summary) for t in found.tasks] == [
        (TaskState.FAILED, "CANCELLED", "cancelled by a client")
    ] * 2
    assert "done" not in {json.loads(line)["event"] for line in out.decode().splitlines()}
