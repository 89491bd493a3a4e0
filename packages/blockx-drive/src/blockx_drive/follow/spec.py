"""What a follow run computes and where it writes it: the task of one block."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blockx_client.models import PluginConfig, Task
from blockx_drive.attempts import OnFailure
from blockx_drive.job_progress import task_prefix


class FollowSpec:
    """What to compute and where to write it."""

    def __init__(
        self,
        *,
        function: str,
        source_table: str,
        where: Mapping[str, Any] | None,
        unit: Mapping[str, Any],
        sink_table: str,
        writer: str,
        writer_config: dict[str, Any],
        tasks_in_flight: int,
        max_attempts: int,
        on_failure: OnFailure,
        reorg_window: int,
        poll_interval_s: float,
        job_id: str,
        chain: str | None = None,
    ) -> None:
        self.function = function
        self.source_table = source_table
        self.where = dict(where) if where else None
        # The Builder config's unit keys (``blockx_drive.call_unit.unit_config``).
        self.unit = dict(unit)
        self.sink_table = sink_table
        self.writer = writer
        self.writer_config = writer_config
        self.tasks_in_flight = tasks_in_flight
        self.max_attempts = max_attempts
        self.on_failure = on_failure
        self.reorg_window = reorg_window
        self.poll_interval_s = poll_interval_s
        # The run's job record; every task id of the run starts with its prefix.
        self.job_id = job_id
        # The chain the tasks read (None: the Workers' only chain), and the chain id
        # of the block database follow plans from (set once it is read).
        self.chain = chain
        self.chain_id = 0
        self.task_prefix = task_prefix(job_id)

    def task(self, number: int, block_hash: str) -> Task:
        config: dict[str, Any] = {
            "function": self.function,
            "table": self.source_table,
            "block": {"number": number, "hash": block_hash},
            **self.unit,
        }
        if self.where:
            config["where"] = self.where
        if self.chain is not None:
            config["chain"] = self.chain
        return Task(
            function_call_config=PluginConfig(type="BlockTableCallConfig", config=config),
            result_handler=PluginConfig(type=self.writer, config=self.writer_config),
        )
