"""The demo's results, read back from the sink and checked against the chain.

Everything here is computed from real data: the sink table and its ledger
(``_blockx_written``), the block database, and the node itself. The checks:

* every block of the chain is in the ledger under its canonical hash, and every
  row of the sink table carries that hash;
* the sink's totals per token equal the block database's ``erc20_transfers``
  summed directly;
* each block of the reorg now holds the new branch's hash in the ledger, in the
  block database and on the node, never the abandoned one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import msgspec
from rich.table import Table

from blockx_chain.devnet import Devnet
from blockx_chain.rpc import quantity
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.demo.job import ChainJob
from blockx_cli.devcluster.demo.live import LiveFigures


class Check(msgspec.Struct, frozen=True):
    ok: bool
    line: str


class Report(msgspec.Struct, frozen=True, kw_only=True):
    tokens: Table
    checks: list[Check]
    lags_ms: list[int]
    blocks: int
    rows: int

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


async def build_report(
    job: ChainJob,
    devnet: Devnet,
    live: LiveFigures,
    *,
    block_db_url: str,
    sink_db_url: str,
) -> Report:
    store = await open_store(parse_blockdb_url(block_db_url), read_only=True)
    try:
        head = live.head
        canonical = {r["block_number"]: r["block_hash"] for r in await store.blocks(0, head)}
        transfers = await store.erc20_transfers(0, head)
        state = await store.chain()
    finally:
        await store.close()
    sink = await open_sink(parse_blockdb_url(sink_db_url))
    try:
        rows = await sink.rows(job.sink_table)
        # The ledger of the devnet's chain (None: nothing ingested, nothing written).
        written = [] if state is None else await sink.written(job.sink_table, state.chain_id)
        ledger = {w["block_number"]: w for w in written}
    finally:
        await sink.close()
    checks = [
        _coverage(canonical, ledger, rows),
        _totals(transfers, rows),
        await _reorg(devnet, live, canonical, ledger),
    ]
    lags = [
        ledger[n]["written_at_ms"] - live.mined[h]
        for n, h in canonical.items()
        if n >= live.first_block and h in live.mined and n in ledger
    ]
    return Report(
        tokens=_tokens(devnet, rows, len(canonical)),
        checks=checks,
        lags_ms=lags,
        blocks=len(ledger),
        rows=len(rows),
    )


def _coverage(
    canonical: dict[int, str], ledger: dict[int, dict[str, Any]], rows: list[dict[str, Any]]
) -> Check:
    wrong = [n for n, h in canonical.items() if ledger.get(n, {}).get("block_hash") != h]
    stale_rows = sum(1 for r in rows if canonical.get(r["block_number"]) != r["block_hash"])
    extra = [n for n in ledger if n not in canonical]
    last = max(canonical, default=-1)
    if wrong or stale_rows or extra:
        return Check(
            False,
            f"sink does NOT match the chain: {len(wrong)} blocks missing or under another "
            f"hash, {stale_rows} rows of a non-canonical block, {len(extra)} blocks above "
            "the head",
        )
    return Check(
        True,
        f"sink covers blocks 0-{last}: each written once, under its canonical hash "
        f"({len(rows):,} rows)",
    )


def _totals(transfers: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Check:
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in transfers:
        expected[t["token"]][0] += 1
        expected[t["token"]][1] += int(t["value"])
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        got[r["token"]][0] += int(r["transfers"])
        got[r["token"]][1] += int(r["volume"])
    if dict(got) != dict(expected):
        return Check(False, "sink totals do NOT match the block database's erc20_transfers")
    count = sum(c for c, _ in expected.values())
    return Check(True, f"sink totals per token equal the block database's {count:,} transfers")


async def _reorg(
    devnet: Devnet,
    live: LiveFigures,
    canonical: dict[int, str],
    ledger: dict[int, dict[str, Any]],
) -> Check:
    reorg = live.reorg
    if reorg is None:
        return Check(False, "reorg: none was produced (the live stage was too short)")
    numbers = sorted(reorg.old_hashes)
    node = {
        n: (await devnet.client.request("eth_getBlockByNumber", [quantity(n), False]))["hash"]
        for n in numbers
    }
    rewritten = [
        n
        for n in numbers
        if ledger.get(n, {}).get("block_hash") == canonical.get(n) == node[n]
        and node[n] != reorg.old_hashes[n]
    ]
    span = f"{numbers[0]}-{numbers[-1]}"
    # Blocks whose abandoned branch follow had written before the reorg (its events).
    overwritten = sum(1 for n in rewritten if reorg.old_hashes[n] in live.written_hashes.get(n, []))
    if len(rewritten) != len(numbers):
        return Check(
            False,
            f"reorg NOT corrected: {len(rewritten)} of {len(numbers)} blocks ({span}) "
            "match the chain",
        )
    return Check(
        True,
        f"reorg corrected: {len(rewritten)} blocks rewritten, sink matches chain "
        f"(blocks {span} above the fork at {reorg.fork_block_number}; follow had written "
        f"{overwritten} of them under the abandoned hash)",
    )


def _tokens(devnet: Devnet, rows: list[dict[str, Any]], blocks: int) -> Table:
    symbols = {t.address: t.symbol for t in devnet.tokens}
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        entry = per[r["token"]]
        entry[0] += int(r["transfers"])
        entry[1] += int(r["volume"])
        entry[2] += 1
    table = Table(title=f"token volume, read back from the sink ({blocks:,} blocks)")
    for column in ("token", "address", "transfers", "volume (tokens)", "active blocks"):
        table.add_column(column, justify="left" if column in ("token", "address") else "right")
    for token, (count, volume, active) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        table.add_row(
            symbols.get(token, "?"),
            token,
            f"{count:,}",
            f"{volume / 10**18:,.2f}",
            f"{active:,}",
        )
    return table


def percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return int(cuts[min(int(q) - 1, 98)])
