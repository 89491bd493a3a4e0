"""ChainIo: one chain a process serves, with the backends that read it.

Each chain has its own ``blockdb`` (its block database), ``rpc`` (its node) and
``meta`` backends, and its own finality view (epoch and finalized height, read from
its block database): a reorganisation of one chain drops no cached answer of
another. The router (``blockx_server.io.router``) holds them by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from blockx_core.chains import Chain
from blockx_server.io.backends.base import IoBackend
from blockx_server.io.finality import FinalityView


class ChainIo:
    def __init__(
        self,
        chain: Chain,
        backends: Sequence[IoBackend],
        finality: FinalityView | None = None,
    ) -> None:
        self._chain = chain
        self.finality = finality
        self.backends: dict[str, IoBackend] = {}
        for backend in backends:
            self.add(backend)

    @property
    def chain(self) -> Chain:
        """Its name and chain id; an id unknown at start-up (0: the shorthand's
        database and node did not answer) is the database's once it is read."""
        if self._chain.chain_id == 0:
            learnt = getattr(self.finality, "chain_id", None)
            if isinstance(learnt, int) and learnt > 0:
                self._chain = Chain(self._chain.name, learnt)
        return self._chain

    def add(self, backend: IoBackend) -> None:
        """One more backend of this chain (before the router serves it)."""
        if backend.name in self.backends:
            raise ValueError(
                f"IO backend {backend.name!r} of chain {self._chain.name!r} is added twice"
            )
        self.backends[backend.name] = backend

    def __repr__(self) -> str:
        return f"ChainIo({self.chain.name!r}, id {self.chain.chain_id}, {sorted(self.backends)})"
