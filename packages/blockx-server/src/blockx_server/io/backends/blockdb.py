"""``io.blockdb``: the block database (``BLOCKDB_URL``), read-only for functions.

Reads: ``head()`` -> ``{"number", "hash", "finalized"}`` or None while nothing is
ingested; ``block(number)`` -> a row or None; ``blocks(from_block, to_block)``
(inclusive); ``hashes(from_block, to_block)``: the ``{"block_number",
"block_hash"}`` of the same blocks, nothing else; ``transactions(block_number)``;
``logs(from_block, to_block=None, address=None, topic0=None)``;
``erc20_transfers(from_block, to_block=None, token=None)``; ``log_filter()`` -> what
a selective database (``blockx chain ingest --logs``) holds, ``{"addresses",
"topic0s", "from_block"}``, or None for one of whole blocks; ``rows(table,
from_block, to_block=None, where=None)``: any block table of the schema
(``blockx_chain.schema.BLOCK_TABLES``: blocks, transactions, logs, erc20_transfers,
withdrawals, nft_transfers, traces, contracts, and any table registered there later,
with nothing to add here), ``where`` a ``{column: value}`` equality filter
(``to_block=None`` means ``from_block`` alone). Rows are dicts keyed by column name,
ordered by block then index. A range whose answer would exceed BLOCKDB_MAX_ROWS is
BAD_REQUEST (narrow it); a database that cannot be reached is a retryable
UNAVAILABLE. There are no writes: ingest (``blockx chain ingest``) fills the
database.

The store is opened at start-up when it can be (``start``) and again on the next
request when it could not, so a Worker started before its database answers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Final

from blockx_chain.schema import AbiRecord, ChainState
from blockx_chain.store import (
    BlockStore,
    NotHeld,
    StoreError,
    StoreUnavailable,
    TooManyRows,
    open_store,
)
from blockx_chain.url import BlockDbUrl, describe
from blockx_core.failures import IoErrorKind
from blockx_server.io.errors import BackendError, IoReason

log = logging.getLogger(__name__)

READS: Final = (
    "head",
    "log_filter",
    "block",
    "blocks",
    "hashes",
    "transactions",
    "logs",
    "erc20_transfers",
    "rows",
)
# What a call may pass: the store's own signatures, less ``self``.
_SIGNATURES: Final = {
    op: inspect.signature(getattr(BlockStore, op)).replace(
        parameters=list(inspect.signature(getattr(BlockStore, op)).parameters.values())[1:]
    )
    for op in READS
}
# The argument naming the last block a read covers; head() names none (it moves).
_LAST_BLOCK: Final[dict[str, tuple[str, ...]]] = {
    "block": ("number",),
    "blocks": ("to_block",),
    "hashes": ("to_block",),
    "transactions": ("block_number",),
    "logs": ("to_block", "from_block"),
    "erc20_transfers": ("to_block", "from_block"),
}
# ``rows`` is not in the table above, so it is never cached: it is the builders'
# range scan, read once per task, and caching it would evict what functions reuse.


class BlockDbBackend:
    name = "blockdb"
    read_ops = frozenset(READS)
    write_ops: frozenset[str] = frozenset()

    def __init__(self, url: BlockDbUrl, max_rows: int) -> None:
        self.url = url
        self.max_rows = max_rows
        self._store: BlockStore | None = None
        self._opening = asyncio.Lock()

    async def start(self) -> None:
        """Open the store now, read-only; SchemaRefused (a database this BlockX may not
        use) goes to the caller. An unreachable database, or none yet (a Worker never
        creates the file: ingest does), is logged and retried on first use."""
        try:
            await self._opened()
        except StoreUnavailable as exc:
            log.warning("io.blockdb: %s; reads answer UNAVAILABLE until it answers", exc)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def _opened(self) -> BlockStore:
        async with self._opening:
            if self._store is None:
                self._store = await open_store(self.url, max_rows=self.max_rows, read_only=True)
                log.info("io.blockdb reads %s", describe(self.url))
            return self._store

    async def _store_or_unavailable(self) -> BlockStore:
        try:
            return await self._opened()
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        signature = _SIGNATURES.get(op)
        if signature is None:
            raise BackendError(IoErrorKind.UNKNOWN_OP, op)
        bound = signature.bind(*args, **kwargs)  # TypeError: BAD_REQUEST
        store = await self._store_or_unavailable()
        try:
            return await getattr(store, op)(*bound.args, **bound.kwargs)
        except TooManyRows as exc:
            raise BackendError(
                IoErrorKind.BAD_REQUEST, f"io.blockdb.{exc}", reason=IoReason.TOO_MANY_ROWS
            ) from None
        except NotHeld as exc:
            # A selective database lacks it for good: asking again gets the same.
            raise BackendError(IoErrorKind.BAD_REQUEST, f"io.blockdb.{op}: {exc}") from None
        except StoreError as exc:
            # Unreachable, or an error of the database itself: not the caller's fault.
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        """Whether the answer can never change (within one chain epoch): the read
        names only blocks at or below ``finalized``. head() and any read reaching
        above the finalized height, or with arguments it cannot use, are not."""
        names = _LAST_BLOCK.get(op)
        signature = _SIGNATURES.get(op)
        if finalized is None or names is None or signature is None:
            return False
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return False
        last = next((arguments[n] for n in names if arguments.get(n) is not None), None)
        return isinstance(last, int) and not isinstance(last, bool) and 0 <= last <= finalized

    async def ingested(self) -> dict[str, int] | None:
        """``{"from_block", "to_block"}``: the blocks the database holds (``io.meta``)."""
        store = await self._store_or_unavailable()
        try:
            held = await store.block_range()
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None
        return None if held is None else {"from_block": held[0], "to_block": held[1]}

    async def chain(self) -> ChainState | None:
        """The chain row (epoch, finalized and head heights): the finality view."""
        store = await self._store_or_unavailable()
        try:
            return await store.chain()
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None

    async def abis(self) -> list[AbiRecord]:
        """The ABI registry (for io.logicalTypes; no function read)."""
        store = await self._store_or_unavailable()
        try:
            return await store.abis()
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None

    async def abis_revision(self) -> tuple[int, int]:
        """What changes with any change of the ABI registry (one tiny query)."""
        store = await self._store_or_unavailable()
        try:
            return await store.abis_revision()
        except StoreError as exc:
            raise BackendError(IoErrorKind.UNAVAILABLE, f"io.blockdb: {exc}") from None
