"""What a follow run computes and where it writes it: the task of one block."""

from __future__ import annotations

from typing import Any

from blockx_client.models import PluginConfig, Task
from blockx_drive.job_progress import task_prefix
from blockx_drive.spec import Checked, JobSpec


class FollowSpec:
    """What to compute and where to write it: ``job`` as ``checked`` (see
    ``blockx_drive.spec``), with follow's own choices."""

    def __init__(
        self,
        job: JobSpec,
        checked: Checked,
        *,
        job_id: str,
        reorg_window: int,
        poll_interval_s: float,
    ) -> None:
        self.function = job.function
        self.source_table = job.source_table
        self.where = dict(job.where) if job.where else None
        # The Builder config's unit keys (``blockx_drive.call_unit.unit_config``).
        self.unit = dict(checked.unit)
        self.sink_table = job.sink_table
        self.writer = checked.writer
        self.writer_config = dict(checked.writer_config)
        self.tasks_in_flight = job.tasks_in_flight
        self.max_attempts = job.max_attempts
        self.on_failure = checked.on_failure
        self.reorg_window = reorg_window
        self.poll_interval_s = poll_interval_s
        # The run's job record; every task id of the run starts with its prefix.
        self.job_id = job_id
        # The chain the tasks read (None: the Workers' only chain), and the chain id
        # of the block database follow plans from (set once it is read).
        self.chain = job.chain
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
