"""Which tasks a backfill runs: the range cut into task ranges, minus those already
written for the blocks' current hashes.

A range is skipped only when the ledger (``_blockx_written``) of the sink table
holds every one of its blocks with the hash the block database holds now: a range
written on an abandoned branch, or written in part, runs again (the writers
replace a block's rows, so running it again leaves the rows of the last run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from blockx_client.models import PluginConfig, Task
from blockx_drive.ledger import up_to_date
from blockx_drive.spec import check_block_number


class BackfillError(Exception):
    """The backfill cannot start as asked (the message says why, in one line)."""


class TaskRange(msgspec.Struct, frozen=True):
    from_block: int
    to_block: int

    @property
    def blocks(self) -> int:
        return self.to_block - self.from_block + 1

    def numbers(self) -> range:
        return range(self.from_block, self.to_block + 1)


class BackfillPlan(msgspec.Struct, frozen=True, kw_only=True):
    from_block: int
    to_block: int
    run: tuple[TaskRange, ...]
    skipped: tuple[TaskRange, ...]


def split(from_block: int, to_block: int, blocks_per_task: int) -> list[TaskRange]:
    """``[from_block, to_block]`` in consecutive ranges of ``blocks_per_task`` blocks
    (the last one may be shorter)."""
    check_range(from_block, to_block)
    if blocks_per_task < 1:
        raise ValueError(f"blocks_per_task must be >= 1, got {blocks_per_task}")
    return [
        TaskRange(start, min(to_block, start + blocks_per_task - 1))
        for start in range(from_block, to_block + 1, blocks_per_task)
    ]


def check_range(from_block: int, to_block: int) -> None:
    check_block_number("from_block", from_block)
    check_block_number("to_block", to_block)
    if to_block < from_block:
        raise ValueError(f"to_block ({to_block}) is below from_block ({from_block})")


def plan(
    ranges: list[TaskRange],
    canonical: Mapping[int, str],
    written: Mapping[int, str],
    *,
    force: bool = False,
) -> BackfillPlan:
    """Which of ``ranges`` to run, given the stored hashes and the ledger."""
    if not ranges:
        raise ValueError("a backfill plan needs at least one range")
    run: list[TaskRange] = []
    skipped: list[TaskRange] = []
    for task_range in ranges:
        done = not force and up_to_date(task_range.numbers(), written, canonical)
        (skipped if done else run).append(task_range)
    return BackfillPlan(
        from_block=ranges[0].from_block,
        to_block=ranges[-1].to_block,
        run=tuple(run),
        skipped=tuple(skipped),
    )


def missing_block(from_block: int, to_block: int, canonical: Mapping[int, str]) -> int | None:
    """The lowest block of the range the block database does not hold."""
    for number in range(from_block, to_block + 1):
        if number not in canonical:
            return number
    return None


def bundle_task(
    task_range: TaskRange,
    *,
    function: str,
    source_table: str,
    where: Mapping[str, Any] | None,
    unit: Mapping[str, Any],
    bundle_size: int | None,
    writer: str,
    writer_config: Mapping[str, Any],
    chain: str | None = None,
) -> Task:
    """The BlockBundleCallConfig task of one range (its task_id is set per attempt),
    of the chain named ``chain`` (None: the Workers' only chain); ``unit`` is the
    Builder config's unit keys (``blockx_drive.call_unit.unit_config``)."""
    config: dict[str, Any] = {
        "function": function,
        "table": source_table,
        "fromBlock": task_range.from_block,
        "toBlock": task_range.to_block,
        **unit,
    }
    if bundle_size is not None:
        config["bundleSize"] = bundle_size
    if where:
        config["where"] = dict(where)
    if chain is not None:
        config["chain"] = chain
    return Task(
        function_call_config=PluginConfig(type="BlockBundleCallConfig", config=config),
        result_handler=PluginConfig(type=writer, config=dict(writer_config)),
    )
