"""What a driver run computes and where it writes it: the job spec backfill and follow
share, and its checks before anything is read or submitted.

    job = JobSpec(function="volume", source_table="erc20_transfers", sink_table="volume",
                  db_url=BLOCKDB_URL, sink_db_url=SINK_DB_URL)
    async for event in backfill(client, job, from_block=0, to_block=9_999): ...
    async for event in follow(client, job, stop=stop): ...

What only one driver takes (backfill's range, follow's reorg window and stop) is a
keyword argument of that driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from blockx_chain.schema import MAX_INTEGER
from blockx_chain.url import BlockDbUrl
from blockx_drive.attempts import check_attempts
from blockx_drive.call_unit import unit_config
from blockx_drive.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_TASKS_IN_FLIGHT, OnFailure
from blockx_drive.submission import as_url, call_command, check_source, writer_config_for


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``function`` over ``source_table`` of the block database (``db_url``), written
    into ``sink_table`` of the sink (``sink_db_url``, the one the Workers write,
    SINK_DB_URL) by ``writer`` (None: the driver's own block writer).

    * ``where``: column values the source rows must have;
    * ``unit``: ``row`` (a call per row), ``block`` (a call per block) or ``event``
      (a call per log of ``logs`` that decodes as the event named ``event`` of the
      registered ABI named ``abi``, with ``{"block", "log", "event"}``);
    * ``chain``: the name of the chain the tasks read (the Workers'
      ``[chains.NAME]``; None: their only chain), ``db_url`` being its block
      database;
    * ``writer_config``: writer options (``key``, ``columns``) added to
      ``{"table": sink_table}``;
    * at most ``tasks_in_flight`` tasks under way; a task is attempted at most
      ``max_attempts`` times, and after one failed for good the run goes on
      (``on_failure="continue"``) or ends (``"stop"``);
    * ``command``: what started the run, as its job record names it (None: the
      driver's Python call).
    """

    function: str
    source_table: str
    sink_table: str
    db_url: str | BlockDbUrl
    sink_db_url: str | BlockDbUrl
    where: Mapping[str, Any] | None = None
    unit: str = "row"
    abi: str | None = None
    event: str | None = None
    chain: str | None = None
    writer: str | None = None
    writer_config: Mapping[str, Any] | None = None
    tasks_in_flight: int = DEFAULT_TASKS_IN_FLIGHT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    on_failure: OnFailure | str = OnFailure.CONTINUE
    command: str | None = None


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    """A ``JobSpec`` as a driver uses it, every argument checked."""

    unit: dict[str, Any]  # the Builder config's unit keys
    on_failure: OnFailure
    block_db: BlockDbUrl
    sink_db: BlockDbUrl
    writer: str
    writer_config: dict[str, Any]


def check_block_number(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is a block number: a whole number
    the 63-bit INTEGER column it is stored in holds."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INTEGER:
        raise ValueError(f"{name} must be a block number (0 to 2**63 - 1), got {value!r}")


def check(job: JobSpec, *, writer: str) -> Checked:
    """``job`` checked (``writer``: the driver's default writer); ValueError for an
    argument a driver cannot use (SubmissionRefused for a source it cannot read)."""
    units = unit_config(job.unit, job.source_table, job.abi, job.event)
    if job.tasks_in_flight < 1:
        raise ValueError(f"tasks_in_flight must be >= 1, got {job.tasks_in_flight}")
    after_failure = check_attempts(job.max_attempts, job.on_failure)
    config = writer_config_for(job.writer_config, job.sink_table)
    check_source(job.source_table, job.where)
    return Checked(
        unit=units,
        on_failure=after_failure,
        block_db=as_url(job.db_url, "db_url"),
        sink_db=as_url(job.sink_db_url, "sink_db_url"),
        writer=job.writer or writer,
        writer_config=config,
    )


def command_of(
    job: JobSpec,
    checked: Checked,
    driver: str,
    names: Iterable[str],
    own: Mapping[str, Any],
) -> str:
    """What started the run: ``job.command``, or the driver's Python call with the
    arguments ``names`` in that order, a driver's ``own`` value or else the job's."""
    if job.command is not None:
        return job.command
    values: dict[str, Any] = {
        "function": job.function,
        "source_table": job.source_table,
        "where": job.where,
        "unit": job.unit,
        "sink_table": job.sink_table,
        "db_url": checked.block_db,
        "sink_db_url": checked.sink_db,
        "writer_config": job.writer_config,
        "chain": job.chain,
        "abi": job.abi,
        "event": job.event,
        **own,
    }
    return call_command(driver, {name: values[name] for name in names})
