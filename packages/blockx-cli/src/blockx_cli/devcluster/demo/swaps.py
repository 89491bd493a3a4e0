"""The demo's decoded events: the pair's ``Swap`` logs, decoded by the Worker.

The pair's ABI (its compiler's JSON, as ``blockx chain abi add pair --file`` takes
it) is registered in the block database for the pair's address; one bundle task
over the history calls ``swap`` once per ``Swap`` with ``unit: "event"`` and writes
a row per swap into the sink. The check decodes the same logs here, by hand from
their data words, and compares the volume of every block.
"""

from __future__ import annotations

import time
from collections import defaultdict

import msgspec
from rich.table import Table

from blockx_chain.abi.spec import entries_from_list, entries_json
from blockx_chain.contracts import SWAP_TOPIC, pair_artifact
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.demo.job import SWAP_JOB
from blockx_cli.devcluster.demo.report import Check
from blockx_client import Client

# The four amounts of a Swap's data, in order, and the sink's columns for them.
AMOUNTS = ("tokens_in", "eth_in", "tokens_out", "eth_out")


class SwapFigures(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float
    failed: list[str]


async def register_pair_abi(block_db_url: str, pair: str) -> None:
    """The pair's ABI in the block database's registry, for the pair's address."""
    entries = entries_from_list(pair_artifact()["abi"], "Pair.json")
    store = await open_store(parse_blockdb_url(block_db_url))
    try:
        async with store.writer() as writer:
            await writer.put_abi(SWAP_JOB.abi or "pair", entries_json(entries), [pair])
    finally:
        await store.close()


async def swaps_stage(client: Client, head: int, bundle_size: int) -> SwapFigures:
    """One bundle task: ``swap`` over every Swap of blocks 0..``head``."""
    started = time.monotonic()
    result = await client.run(SWAP_JOB.bundle_task(0, head, bundle_size, "demo-swaps"))
    failed = (
        []
        if result.ok
        else [f"{result.task_id}: {result.failure_code or ''} {result.failure_message}"]
    )
    return SwapFigures(seconds=time.monotonic() - started, failed=failed)


async def swap_report(
    block_db_url: str, sink_db_url: str, pair: str, head: int
) -> tuple[Table, Check]:
    """The swap volume per block from the sink, checked against the block database's
    Swap logs decoded here from their data words."""
    store = await open_store(parse_blockdb_url(block_db_url), read_only=True)
    try:
        logs = await store.logs(0, head, address=pair, topic0=SWAP_TOPIC)
    finally:
        await store.close()
    expected: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for log in logs:
        words = log["data"][2:]
        entry = expected[log["block_number"]]
        entry[0] += 1
        for i in range(4):
            entry[i + 1] += int(words[64 * i : 64 * (i + 1)], 16)
    sink = await open_sink(parse_blockdb_url(sink_db_url))
    try:
        rows = await sink.rows(SWAP_JOB.sink_table)
    finally:
        await sink.close()
    got: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row in rows:
        entry = got[row["block_number"]]
        entry[0] += 1
        for i, column in enumerate(AMOUNTS):
            entry[i + 1] += int(row[column])
    table = _volume_table(got, len(rows))
    if dict(got) != dict(expected) or not expected:
        differ = sorted(set(got) ^ set(expected) | {n for n in got if got[n] != expected.get(n)})
        return table, Check(
            False,
            f"swap volume does NOT match the pair's Swap logs: {len(differ)} blocks differ "
            f"({len(rows)} sink rows, {len(logs)} logs)",
        )
    return table, Check(
        True,
        f"swap volume of each of {len(expected):,} blocks equals the pair's {len(logs):,} "
        "Swap logs decoded from their data",
    )


def _volume_table(per_block: dict[int, list[int]], swaps: int) -> Table:
    table = Table(title=f"swap volume per block, decoded by the Worker ({swaps:,} swaps)")
    for column in ("blocks", "swaps", "ETH in", "ETH out", "tokens in", "tokens out"):
        table.add_column(column, justify="right")
    totals = [sum(v[i] for v in per_block.values()) for i in range(5)]
    table.add_row(
        f"{len(per_block):,}",
        f"{totals[0]:,}",
        f"{totals[2] / 10**18:,.4f}",
        f"{totals[4] / 10**18:,.4f}",
        f"{totals[1] / 10**18:,.2f}",
        f"{totals[3] / 10**18:,.2f}",
    )
    busiest = max(per_block.items(), key=lambda kv: kv[1][2] + kv[1][4], default=None)
    if busiest is not None:
        number, (count, tokens_in, eth_in, tokens_out, eth_out) = busiest
        table.add_row(
            f"busiest: {number}",
            f"{count}",
            f"{eth_in / 10**18:,.4f}",
            f"{eth_out / 10**18:,.4f}",
            f"{tokens_in / 10**18:,.2f}",
            f"{tokens_out / 10**18:,.2f}",
        )
    return table
