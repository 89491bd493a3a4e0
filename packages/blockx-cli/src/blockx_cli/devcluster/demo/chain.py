"""The demo's chain stages: fill anvil with blocks of transfers, and ingest them.

The ingest follows the generation: while anvil mines, the blocks mined so far go
into the block database, one ingest run after another, each up to the head mined
when it starts (anvil's answers are waited for, so the two share the time). The
ingest stage then ingests what the generation mined last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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


class Ingests:
    """Ingest runs into the block database, one after another, each to the head the
    generation had mined when it started."""

    def __init__(self, rpc_url: str, block_db_url: str) -> None:
        self.rpc_url = rpc_url
        self.block_db_url = block_db_url
        self.summaries: list[IngestSummary] = []
        self._running: asyncio.Task[IngestSummary] | None = None

    def catch_up(self, head: int) -> None:
        """Start a run to ``head`` unless one runs (a finished run's error is raised)."""
        if self._running is not None:
            if not self._running.done():
                return
            self.summaries.append(self._running.result())
        self._running = asyncio.ensure_future(self._run(head))

    async def finish(self, head: int, on_progress: IngestProgressFn) -> None:
        """The run under way, then one to ``head``."""
        if self._running is not None:
            running, self._running = self._running, None
            self.summaries.append(await running)
        if not self.summaries or self.summaries[-1].to_block < head:
            self.summaries.append(await self._run(head, on_progress))

    def cancel(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.cancel()

    @property
    def blocks(self) -> int:
        return sum(s.blocks for s in self.summaries)

    async def _run(self, head: int, on_progress: IngestProgressFn | None = None) -> IngestSummary:
        options = IngestOptions(to_block=head, batch_size=100)
        return await ingest(
            self.rpc_url, parse_blockdb_url(self.block_db_url), options, on_progress=on_progress
        )


IngestProgressFn = Callable[[IngestProgress], None]


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
    devnet: Devnet, blocks: int, transfers: Transfers, ingests: Ingests, console: Console
) -> Generated:
    """Deploy the test tokens, hand them out, deploy the pair, and mine ``blocks``
    blocks of transfers and swaps, ``ingests`` catching up after each chunk."""
    started = time.monotonic()
    setup = await devnet.setup(TOKENS)
    setup += await devnet.setup_pair()
    txs = sum(b.transactions for b in setup)
    head = setup[-1].number
    try:
        with progress_bar(console) as progress:
            bar = progress.add_task("blocks mined", total=blocks, rate="")
            done = 0
            while done < blocks:
                ingests.catch_up(head)
                mined = await transfers.mine(devnet, min(_CHUNK, blocks - done))
                done += len(mined)
                txs += sum(b.transactions for b in mined)
                head = mined[-1].number
                rate = txs / max(time.monotonic() - started, 1e-9)
                progress.update(bar, completed=done, rate=f"{rate:,.0f} tx/s")
    except BaseException:
        ingests.cancel()
        raise
    return Generated(head=head, transactions=txs, seconds=time.monotonic() - started)


async def ingest_stage(ingests: Ingests, head: int, console: Console) -> IngestSummary:
    """Blocks 0..``head`` in the block database: the runs that followed the
    generation, then the rest. Their summaries added up."""
    try:
        with progress_bar(console) as progress:
            bar = progress.add_task("blocks ingested", total=head + 1, rate="")
            before = ingests.blocks

            def show(p: IngestProgress) -> None:
                progress.update(
                    bar,
                    completed=ingests.blocks + p.blocks,
                    rate=f"{p.blocks_per_s:,.0f} blocks/s",
                )

            progress.update(bar, completed=before)
            await ingests.finish(head, show)
            progress.update(bar, completed=ingests.blocks)
    except BaseException:
        ingests.cancel()
        raise
    runs = ingests.summaries
    return IngestSummary(
        from_block=runs[0].from_block,
        to_block=runs[-1].to_block,
        blocks=sum(r.blocks for r in runs),
        transactions=sum(r.transactions for r in runs),
        logs=sum(r.logs for r in runs),
        erc20_transfers=sum(r.erc20_transfers for r in runs),
        nft_transfers=sum(r.nft_transfers for r in runs),
        reorgs=sum(r.reorgs for r in runs),
        seconds=sum(r.seconds for r in runs),
    )
