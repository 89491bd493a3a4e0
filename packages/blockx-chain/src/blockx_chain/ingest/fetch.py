"""Fetching a batch of blocks from the node: blocks in full and their receipts, in
one JSON-RPC batch, retried when the node is busy or changed between requests.

Every answer is checked against its request first (``blockx_chain.rpc.answers``):
one that is not what was asked for is BadNodeAnswer at once, never retried."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from blockx_chain.ingest.errors import BadNodeAnswer, IngestError, NodeUnusable
from blockx_chain.ingest.rows import Inconsistent, Traced, block_rows
from blockx_chain.ingest.traces import TraceMethod, params
from blockx_chain.rpc import EthRpc, RpcError, RpcErrorKind, parse_quantity
from blockx_chain.schema import BlockRows
from blockx_core.backoff import Backoff

RETRY_ATTEMPTS: Final = 6
RETRY_BACKOFF: Final = Backoff(initial_s=0.1, max_s=3.0)


def backoff_s(attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``RETRY_BACKOFF``, equal jitter."""
    return RETRY_BACKOFF.delay(attempt, random.random())


class NodeShortened(Exception):
    """The node lacks a block at or below the head it reported: its chain got
    shorter since (a reorg to a shorter branch), or it is catching up. The run reads
    the head again and goes on from the same block."""


async def retried(
    numbers: range, attempts: int, once: Callable[[], Awaitable[list[BlockRows]]]
) -> list[BlockRows]:
    """``once()``, the fetch of ``numbers``, again after a back-off while the node
    is busy or changes between requests, up to ``attempts`` times: a block the
    node lacks is NodeShortened, an error it cannot recover from IngestError, and
    a node that keeps changing NodeUnusable."""
    for attempt in range(1, attempts + 1):
        try:
            return await once()
        except RpcError as exc:
            if exc.kind is RpcErrorKind.NOT_FOUND:
                raise NodeShortened(f"blocks {_span(numbers)}: {exc.message}") from None
            if not exc.retryable or attempt == attempts:
                raise failed(exc, f"blocks {_span(numbers)}: ") from None
        except Inconsistent as exc:
            if attempt == attempts:
                raise NodeUnusable(
                    f"blocks {_span(numbers)}: the node keeps changing them ({exc})"
                ) from None
        await asyncio.sleep(backoff_s(attempt))
    raise AssertionError("unreachable")


class BatchFetcher:
    def __init__(
        self, eth: EthRpc, attempts: int = RETRY_ATTEMPTS, traces: TraceMethod | None = None
    ) -> None:
        self.eth = eth
        self.attempts = attempts
        # The method each block's call frames are asked with; None: no traces.
        self.traces = traces

    async def blocks(self, numbers: range) -> list[BlockRows]:
        """Rows of ``numbers``, a chain (each block's parent is the one before); a
        node that keeps failing or changing is NodeUnusable."""
        return await retried(numbers, self.attempts, lambda: self._once(numbers))

    async def _once(self, numbers: range) -> list[BlockRows]:
        wanted = list(numbers)
        # Issued in one loop turn, all go out in the same JSON-RPC batch.
        blocks, receipts, traced = await asyncio.gather(
            self.eth.get_blocks(wanted, full=True),
            self.eth.get_block_receipts(wanted),
            self._traces(wanted),
        )
        rows = [block_rows(b, r, t) for b, r, t in zip(blocks, receipts, traced, strict=True)]
        for before, after in itertools.pairwise(rows):
            if after.block.parent_hash != before.block.block_hash:
                raise Inconsistent(f"block {after.block.block_number} is not on its parent")
        return rows

    async def _traces(self, numbers: list[int]) -> list[Traced | None]:
        method = self.traces
        if method is None:
            return [None] * len(numbers)
        answers = await asyncio.gather(
            *(self.eth.client.request(method.value, params(method, n)) for n in numbers)
        )
        return [Traced(method, answer) for answer in answers]

    async def hashes(self, numbers: Sequence[int]) -> dict[int, str]:
        """The node's block hashes, for a fork walk (headers only). A block the node
        does not have is left out: its chain got shorter since its head was read (a
        reorg to a shorter branch), so that block is on no branch the node holds."""
        for attempt in range(1, self.attempts + 1):
            try:
                found = await asyncio.gather(*(self._header(n) for n in numbers))
                return {
                    parse_quantity(b["number"]): b["hash"].lower() for b in found if b is not None
                }
            except RpcError as exc:
                if not exc.retryable or attempt == self.attempts:
                    raise failed(exc, "fork walk: ") from None
            await asyncio.sleep(backoff_s(attempt))
        raise AssertionError("unreachable")

    async def _header(self, number: int) -> dict[str, Any] | None:
        try:
            return await self.eth.get_block(number, full=False)
        except RpcError as exc:
            if exc.kind is RpcErrorKind.NOT_FOUND:
                return None
            raise

    async def head(self) -> tuple[int, int | None]:
        """The node's head and its finalized block (None when it reports none)."""
        for attempt in range(1, self.attempts + 1):
            try:
                head, finalized = await asyncio.gather(
                    self.eth.block_number(), self.eth.finalized_block()
                )
                return head, finalized
            except RpcError as exc:
                if not exc.retryable or attempt == self.attempts:
                    raise failed(exc, "the node's head: ") from None
            await asyncio.sleep(backoff_s(attempt))
        raise AssertionError("unreachable")


async def node_identity(eth: EthRpc) -> tuple[int, str]:
    """The chain id and genesis hash, asked once (no retry: a node that does not
    answer at the start is reported at once)."""
    try:
        chain_id, genesis = await asyncio.gather(eth.chain_id(), eth.get_block(0, full=False))
    except RpcError as exc:
        if exc.kind is RpcErrorKind.NOT_FOUND:
            raise NodeUnusable(
                f"the node at {eth.client.url} has no genesis block (it prunes its history)"
            ) from None
        raise failed(exc) from None
    return chain_id, genesis["hash"].lower()


def failed(exc: RpcError, what: str = "") -> IngestError:
    """The run's error for a request that failed for good: BadNodeAnswer for an answer
    that is not the one asked for, NodeUnusable for a node that did not answer."""
    if exc.kind is RpcErrorKind.BAD_ANSWER:
        return BadNodeAnswer(what + exc.message)
    return NodeUnusable(what + exc.message)


def _span(numbers: range) -> str:
    return f"{numbers.start}..{numbers.stop - 1}"
