"""What the IO subsystem knows of the chain: its epoch and finalized height.

The owner of the block database refreshes a ``FinalityView`` (at most every
IO_FINALITY_REFRESH_MS); the router reads it on every request. A backend decides
from ``finalized`` whether an answer can never change (``IoBackend.immutable``),
and the read cache keys every answer by ``epoch``, so a new epoch (a reorganisation
below the finalized height) drops every answer read before it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from blockx_chain.schema import ChainState
from blockx_server.io.errors import BackendError

log = logging.getLogger(__name__)


class FinalityView(Protocol):
    @property
    def epoch(self) -> int: ...

    @property
    def finalized(self) -> int | None:
        """The highest finalized block number, None while unknown."""
        ...


class StaticFinality:
    """A view set by hand (tests, and processes without a block database)."""

    def __init__(self, finalized: int | None = None, epoch: int = 0) -> None:
        self.finalized = finalized
        self.epoch = epoch


class ChainSource(Protocol):
    """Where the chain row comes from: the ``blockdb`` backend."""

    async def chain(self) -> ChainState | None: ...


class ChainFinality:
    """The block database's chain row as the IO subsystem's finality view.

    ``run()`` re-reads it every ``refresh_ms`` (IO_FINALITY_REFRESH_MS). Until the
    first good read, and while the database is empty, ``finalized`` is None, so
    nothing chain-related is cached; a failed read keeps the last known values (a
    finalized height only grows within an epoch, so an old one is never wrong).
    """

    def __init__(self, source: ChainSource, refresh_ms: int) -> None:
        self._source = source
        self._refresh_s = refresh_ms / 1000
        self.epoch = 0
        self.finalized: int | None = None
        # The chain id the database holds; None until it is read.
        self.chain_id: int | None = None

    async def refresh(self) -> None:
        try:
            chain = await self._source.chain()
        except BackendError as exc:
            log.warning("cannot read the chain's finality from the block database: %s", exc)
            return
        except Exception:
            # A bug must not take the Worker down with it: the view only stays old.
            log.exception("reading the chain's finality failed")
            return
        if chain is not None:
            self.chain_id = chain.chain_id
            self.epoch = chain.epoch
            self.finalized = chain.finalized_number

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._refresh_s)
