"""The drivers' job records in the sink: ``_blockx_jobs``, one row per run.

A backfill or a follow runs in its caller's process, not on the cluster; it keeps
a record of itself in the sink it writes, beside ``_blockx_written``, so the
record outlives the process and anyone who can read the sink can list it. The
sink does not interpret a record: it stores the driver's JSON (``record``) with
the columns a query filters and orders on, each a copy of a field of the JSON.

``_blockx_jobs``: ``job_id`` (the key), ``kind``, ``state``, ``function``,
``sink_table``, ``started_ms``, ``updated_ms``, ``ended_ms`` (NULL while it
runs) and ``record``. A store keeps the newest ``JOBS_KEPT`` ended records: each
new record removes the ended ones beyond them.
"""

from __future__ import annotations

from typing import Final

import msgspec

from blockx_chain.sink.schema import JOBS_TABLE

# Ended records a sink keeps (the newest by start); running ones are never removed.
JOBS_KEPT: Final = 1000


def job_statements(postgres: bool) -> list[str]:
    """The table and its index, made with the writers' other tables."""
    big = "BIGINT" if postgres else "INTEGER"
    return [
        f"CREATE TABLE IF NOT EXISTS {JOBS_TABLE} (job_id TEXT NOT NULL PRIMARY KEY, "
        "kind TEXT NOT NULL, state TEXT NOT NULL, function TEXT NOT NULL, "
        f"sink_table TEXT NOT NULL, started_ms {big} NOT NULL, updated_ms {big} NOT NULL, "
        f"ended_ms {big}, record TEXT NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {JOBS_TABLE}_by_update ON {JOBS_TABLE} (updated_ms)",
    ]


class JobEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``_blockx_jobs``: ``record`` is the driver's JSON, the other
    fields copies of its fields for queries."""

    job_id: str
    kind: str
    state: str
    function: str
    sink_table: str
    started_ms: int
    updated_ms: int
    ended_ms: int | None
    record: str


PUT_SQL: Final = (
    f"INSERT INTO {JOBS_TABLE} (job_id, kind, state, function, sink_table, started_ms, "
    "updated_ms, ended_ms, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET kind = excluded.kind, state = excluded.state, "
    "function = excluded.function, sink_table = excluded.sink_table, "
    "started_ms = excluded.started_ms, updated_ms = excluded.updated_ms, "
    "ended_ms = excluded.ended_ms, record = excluded.record"
)
PRUNE_SQL: Final = (
    f"DELETE FROM {JOBS_TABLE} WHERE ended_ms IS NOT NULL AND job_id NOT IN "
    f"(SELECT job_id FROM {JOBS_TABLE} WHERE ended_ms IS NOT NULL "
    "ORDER BY started_ms DESC, job_id LIMIT ?)"
)
_COLUMNS: Final = (
    "job_id, kind, state, function, sink_table, started_ms, updated_ms, ended_ms, record"
)
NEWEST_SQL: Final = f"SELECT {_COLUMNS} FROM {JOBS_TABLE} ORDER BY updated_ms DESC, job_id LIMIT ?"
ONE_SQL: Final = f"SELECT {_COLUMNS} FROM {JOBS_TABLE} WHERE job_id = ?"


def put_params(entry: JobEntry) -> tuple[object, ...]:
    return (
        entry.job_id,
        entry.kind,
        entry.state,
        entry.function,
        entry.sink_table,
        entry.started_ms,
        entry.updated_ms,
        entry.ended_ms,
        entry.record,
    )
