"""The job spec both drivers take: its checks, one line each, and the command a job
record names when the caller gives none."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from blockx_chain.url import SqliteUrl
from blockx_drive import JobSpec, OnFailure, SubmissionRefused
from blockx_drive.spec import check, command_of

JOB = JobSpec(
    function="volume",
    source_table="erc20_transfers",
    sink_table="volume",
    db_url="sqlite:////data/blocks.db",
    sink_db_url="sqlite:////data/sink.db",
)


def test_a_checked_job_has_its_urls_writer_and_config() -> None:
    checked = check(JOB, writer="BlockWriteResultHandler")
    assert (checked.block_db, checked.sink_db) == (
        SqliteUrl(Path("/data/blocks.db")),
        SqliteUrl(Path("/data/sink.db")),
    )
    assert (checked.writer, checked.on_failure) == ("BlockWriteResultHandler", OnFailure.CONTINUE)
    assert checked.writer_config == {"table": "volume"}
    assert checked.unit == {"unit": "row"}
    mine = replace(JOB, writer="Mine", on_failure="stop")
    assert (check(mine, writer="Other").writer, check(mine, writer="Other").on_failure) == (
        "Mine",
        OnFailure.STOP,
    )


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"tasks_in_flight": 0}, ValueError, "tasks_in_flight must be >= 1, got 0"),
        ({"max_attempts": 0}, ValueError, "max_attempts must be a whole number from 1 to"),
        ({"on_failure": "skip"}, ValueError, "on_failure must be 'continue' or 'stop'"),
        ({"unit": "rows"}, ValueError, "unit must be one of row, block, event"),
        ({"db_url": "mysql://x"}, ValueError, "db_url: "),
        ({"sink_db_url": "mysql://x"}, ValueError, "sink_db_url: "),
        ({"source_table": "transfers"}, SubmissionRefused, "is not a table of the block database"),
        ({"writer_config": {"columns": {"v": "FLOAT"}}}, ValueError, "columns: "),
    ],
)
def test_a_job_a_driver_cannot_use_is_refused(
    change: dict[str, object], error: type[Exception], message: str
) -> None:
    job = replace(JOB, **change)
    with pytest.raises(error, match=message):
        check(job, writer="BlockWriteResultHandler")


def test_the_command_is_the_drivers_call_unless_the_job_names_one() -> None:
    checked = check(JOB, writer="BlockWriteResultHandler")
    names = ("function", "source_table", "where", "from_block", "db_url", "force")
    assert command_of(JOB, checked, "backfill", names, {"from_block": 5, "force": None}) == (
        "backfill(function='volume', source_table='erc20_transfers', from_block=5, "
        "db_url='sqlite:////data/blocks.db')"
    )
    named = replace(JOB, command="blockx follow --function volume")
    assert command_of(named, checked, "follow", names, {}) == "blockx follow --function volume"
