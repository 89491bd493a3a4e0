"""The demo's chain stages: fill anvil with blocks of transfers, then ingest them."""

from __future__ import annotations

import time
from typing import Final

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from blockx_chain.devnet import Devnet, MinedBlock, Reorg
from blockx_chain.ingest import IngestOptions, IngestProgress, IngestSummary, ingest
from blockx_chain.url import parse_blockdb_url

TOKENS: Final = 3
# Blocks mined between two progress updates.
_CHUNK: Final = 100


class Transfers(msgspec.Struct, frozen=True, kw_only=True):
    """What each generated block holds."""

    # A swap moves a token too: 3 transfers and a swap cost about what 4 transfers did.
    token_transfers: int = 3
    eth_transfers: int = 1
    # Trades on the devnet's AMM-style pair (one in eight makes a frame of every kind).
    swaps: int = 1

    async def mine(
        self, devnet: Devnet, blocks: int, *, reorgable: bool = False
    ) -> list[MinedBlock]:
        return await devnet.mine(
            blocks,
            token_transfers=self.token_transfers,
            eth_transfers=self.eth_transfers,
            reorgable=reorgable,
            swaps=self.swaps,
        )

    async def reorg(self, devnet: Devnet, depth: int) -> Reorg:
        return await devnet.reorg(
            depth,
            token_transfers=self.token_transfers,
            eth_transfers=self.eth_transfers,
            swaps=self.swaps,
        )


class Generated(msgspec.Struct, frozen=True, kw_only=True):
    head: int
    transactions: int
    seconds: float


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("  [bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )


async def generate_stage(
    devnet: Devnet, blocks: int, transfers: Transfers, console: Console
) -> Generated:
    """Deploy the test tokens, hand them out, deploy the pair, and mine ``blocks``
    blocks of transfers and swaps."""
    started = time.monotonic()
    setup = await devnet.setup(TOKENS)
    setup += await devnet.setup_pair()
    txs = sum(b.transactions for b in setup)
    head = setup[-1].number
    with progress_bar(console) as progress:
        bar = progress.add_task("blocks mined", total=blocks, rate="")
        done = 0
        while done < blocks:
            mined = await transfers.mine(devnet, min(_CHUNK, blocks - done))
            done += len(mined)
            txs += sum(b.transactions for b in mined)
            head = mined[-1].number
            rate = txs / max(time.monotonic() - started, 1e-9)
            progress.update(bar, completed=done, rate=f"{rate:,.0f} tx/s")
    return Generated(head=head, transactions=txs, seconds=time.monotonic() - started)


async def ingest_stage(
    rpc_url: str, block_db_url: str, head: int, console: Console
) -> IngestSummary:
    """Blocks 0..``head`` from the node into the block database, one run to the head."""
    with progress_bar(console) as progress:
        bar = progress.add_task("blocks ingested", total=head + 1, rate="")

        def show(p: IngestProgress) -> None:
            progress.update(bar, completed=p.blocks, rate=f"{p.blocks_per_s:,.0f} blocks/s")

        options = IngestOptions(to_block=head, batch_size=100)
        summary = await ingest(rpc_url, parse_blockdb_url(block_db_url), options, on_progress=show)
        progress.update(bar, completed=summary.blocks)
    return summary
