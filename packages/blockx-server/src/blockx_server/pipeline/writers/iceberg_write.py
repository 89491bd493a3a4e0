"""``IcebergWriteResultHandler`` (``IcebergTableWriteHandler``): each block's rows
replace that block's rows of an Iceberg table of the lake (``io.iceberg``).

``{"table", "key"?, "columns"?, "sinkIdentity"?, "chainId"?}``, as for
``BlockWriteResultHandler``: the outputs grouped per block the same way (every
block the task covered reaches the ledger, with or without rows), checked
canonical against ``io.blockdb``, for the task's chain. All of a task's blocks go
in one ``io.iceberg.replace_blocks``: one catalog commit per task, however many
bundles its Builder made (Iceberg commits cost more, and slow down, the more of
them a table has). ``sinkIdentity`` is the identity of the lake's ledger database
(the driver's ``--sink-db``). Result ``{"table", "blocks", "rows",
"snapshot_id"}``: the table's snapshot after the commit (None: nothing written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blockx_core.calls import RootOutput
from blockx_server.io.backends.iceberg import ICEBERG
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.writers.block_write import (
    BlockWriteConfig,
    off_loop,
    parse_config,
    replace_blocks,
    rows_per_block,
    task_chain,
)


class IcebergWriteResultHandler:
    """Result ``{"table", "blocks", "rows", "snapshot_id"}``."""

    name = "IcebergWriteResultHandler"

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        parsed: BlockWriteConfig = parse_config(config, BlockWriteConfig, self.name)
        task_chain(ctx, self.name, parsed.chain_id)
        blocks = await off_loop(
            outputs, lambda: rows_per_block(outputs, self.name, ctx.scan.block_hashes)
        )
        written = {"blocks": 0, "rows": 0}
        if blocks or parsed.sink_identity is not None:
            written = await replace_blocks(ctx, self.name, parsed, blocks, backend=ICEBERG)
        # 0 from the lake: no commit was made.
        snapshot_id = written.pop("snapshot_id", 0) or None
        return msgspec.json.encode({"table": parsed.table, **written, "snapshot_id": snapshot_id})
