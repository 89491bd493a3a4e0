"""``IcebergWriteResultHandler`` (``IcebergTableWriteHandler``): each block's rows
replace that block's rows of an Iceberg table of the lake (``io.iceberg``).

The block writer (``BlockWriteResultHandler``) writing ``io.iceberg`` instead of
``io.sink``: the same config (``{"table", "key"?, "columns"?, "sinkIdentity"?,
"chainId"?}``), the outputs grouped per block the same way (every block the task
covered reaches the ledger, with or without rows), checked canonical against
``io.blockdb``, for the task's chain. All of a task's blocks go in one
``io.iceberg.replace_blocks``: one catalog commit per task, however many bundles
its Builder made (Iceberg commits cost more, and slow down, the more of them a
table has). ``sinkIdentity`` is the identity of the lake's ledger database (the
driver's ``--sink-db``). Result ``{"table", "blocks", "rows", "snapshot_id"}``:
the table's snapshot after the commit (None: nothing was committed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import RootOutput
from blockx_server.io.backends.iceberg import ICEBERG
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.writers.block_write import BlockWriteResultHandler


class IcebergWriteResultHandler(BlockWriteResultHandler):
    """Result ``{"table", "blocks", "rows", "snapshot_id"}``."""

    name = "IcebergWriteResultHandler"
    backend = ICEBERG

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        written = msgspec.json.decode(await super().execute(ctx, config, outputs))
        # 0 from the lake, or no write at all: no commit was made.
        written["snapshot_id"] = written.get("snapshot_id") or None
        return msgspec.json.encode(written)
