"""``TableUpsertsResultHandler`` (``NormalTableWriteHandler``): the calls' rows
upserted into a sink table by a key.

``{"table", "key", "columns"?, "sinkIdentity"?}``; ``key`` (a column or a list
of columns) is required; ``sinkIdentity`` as for ``BlockWriteResultHandler``. A
function returns a dict (one row), a list of dicts, or None; every row of the
task goes in one ``io.sink.upsert`` transaction, a row whose key is already there
replacing its columns. Rows are written as returned (no block stamps); the
task's code goes with them as with ``BlockWriteResultHandler``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import RootOutput
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError, answer_of
from blockx_server.pipeline.writers.block_write import (
    code_arguments,
    off_loop,
    output_rows,
    parse_config,
)


class TableUpsertsConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    table: str
    key: list[str] | str
    columns: dict[str, str] | None = None
    sink_identity: str | None = None


class TableUpsertsResultHandler:
    """Result ``{"table", "rows"}``."""

    name = "TableUpsertsResultHandler"

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        parsed: TableUpsertsConfig = parse_config(config, TableUpsertsConfig, self.name)
        key = [parsed.key] if isinstance(parsed.key, str) else parsed.key
        if not key:
            raise PluginError.of(f"{self.name} config: key names no column", retryable=False)
        rows = await off_loop(
            outputs,
            lambda: [row for output in outputs for row in output_rows(output, self.name)],
        )
        written = {"rows": 0}
        if rows or parsed.sink_identity is not None:
            outcome = await ctx.io.request(
                "sink",
                "upsert",
                [],
                {
                    "table": parsed.table,
                    "rows": rows,
                    "key": key,
                    "columns": parsed.columns,
                    "sink_identity": parsed.sink_identity,
                    "code_epoch": ctx.code.epoch,
                    "task_id": ctx.task_id,
                    "now_ms": time.time_ns() // 1_000_000,
                    **code_arguments(ctx),
                },
                retry=True,
            )
            answer = answer_of(outcome, f"{self.name}: writing table {parsed.table!r}")
            written = msgspec.json.decode(answer.value_json)
        return msgspec.json.encode({"table": parsed.table, **written})
