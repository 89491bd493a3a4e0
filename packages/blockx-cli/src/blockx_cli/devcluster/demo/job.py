"""What the demo computes: functions over chain tables into sink tables.

``ChainJob()`` is ``token_volume``: per block and token over ``erc20_transfers``.
``SWAP_JOB`` is ``swap``: one row per ``Swap`` of the devnet's pair, over ``logs``
with ``unit: "event"`` (the Worker decodes each log with the ABI registered as
``pair``), keyed by block and log index.

Backfill (``blockx_drive.backfill``, the bundle cluster) and live
(``blockx_drive.follow``, the block cluster) run the same function into the same
sink table, keyed by block and token, so live blocks extend the backfilled ones. ``bundle_task`` and
``block_task`` are the single tasks of the two shapes the drivers submit, for
running one range or one block by hand (the local cluster's tests do).
"""

from __future__ import annotations

from typing import Any

import msgspec

from blockx_client import PluginConfig, Task
from blockx_drive import JobSpec


class ChainJob(msgspec.Struct, frozen=True, kw_only=True):
    function: str = "token_volume"
    source_table: str = "erc20_transfers"
    unit: str = "block"
    sink_table: str = "token_volume"
    key: tuple[str, ...] = ("block_number", "token")
    # Declared, not inferred: a block's volume may fit 63 bits and the next one not.
    columns: dict[str, str] = msgspec.field(
        default_factory=lambda: {
            "token": "TEXT",
            "transfers": "INTEGER",
            "volume": "NUMERIC",
            "senders": "INTEGER",
        }
    )

    # ``unit: "event"``: the registered ABI and the event the function is called for.
    abi: str | None = None
    event: str | None = None

    def _scan(self) -> dict[str, Any]:
        """What every task's Builder config holds besides its blocks."""
        scan: dict[str, Any] = {
            "function": self.function,
            "table": self.source_table,
            "unit": self.unit,
        }
        if self.abi is not None:
            scan |= {"abi": self.abi, "event": self.event}
        return scan

    def writer_config(self) -> dict[str, Any]:
        """The writers' options besides the table (the drivers add ``table``)."""
        return {"key": list(self.key), "columns": self.columns}

    def spec(self, *, db_url: str, sink_db_url: str, tasks_in_flight: int = 4) -> JobSpec:
        """What the drivers run: this job from the block database ``db_url`` into the
        sink ``sink_db_url``."""
        return JobSpec(
            function=self.function,
            source_table=self.source_table,
            unit=self.unit,
            abi=self.abi,
            event=self.event,
            sink_table=self.sink_table,
            writer_config=self.writer_config(),
            db_url=db_url,
            sink_db_url=sink_db_url,
            tasks_in_flight=tasks_in_flight,
        )

    def _writer(self, name: str) -> PluginConfig:
        return PluginConfig(type=name, config={"table": self.sink_table, **self.writer_config()})

    def bundle_task(self, first: int, last: int, bundle_size: int, task_id: str) -> Task:
        """Blocks ``first``..``last`` on the bundle cluster, one transaction per bundle."""
        scan = {**self._scan(), "fromBlock": first, "toBlock": last, "bundleSize": bundle_size}
        return Task(
            function_call_config=PluginConfig(type="BlockBundleCallConfig", config=scan),
            result_handler=self._writer("BlockBundleWriteResultHandler"),
            task_id=task_id,
        )

    def block_task(self, number: int, block_hash: str, task_id: str) -> Task:
        """One block, pinned to its hash, on the block cluster."""
        scan = {**self._scan(), "block": {"number": number, "hash": block_hash}}
        return Task(
            function_call_config=PluginConfig(type="BlockTableCallConfig", config=scan),
            result_handler=self._writer("BlockWriteResultHandler"),
            task_id=task_id,
        )


SWAP_JOB = ChainJob(
    function="swap",
    source_table="logs",
    unit="event",
    abi="pair",
    event="Swap",
    sink_table="swaps",
    key=("block_number", "log_index"),
    columns={
        "trader": "TEXT",
        "tokens_in": "NUMERIC",
        "eth_in": "NUMERIC",
        "tokens_out": "NUMERIC",
        "eth_out": "NUMERIC",
    },
)
