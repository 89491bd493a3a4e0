"""Chain ingest: fill the block database from an Ethereum node, reorg-aware.

``await ingest(rpc_url, db_url, IngestOptions(...))`` runs once (or follows the
head until ``stop`` is set) and returns an ``IngestSummary``; see
``blockx_chain.ingest.run`` for the run and ``blockx_chain.ingest.plan`` for its
decisions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blockx_chain.ingest.errors import (
    BadNodeAnswer,
    DeepReorgRefused,
    FilterRefused,
    GapRefused,
    IngestError,
    NodeUnusable,
    ReorgTooDeep,
)

if TYPE_CHECKING:
    from blockx_chain.ingest.run import IngestOptions, IngestProgress, IngestSummary, ingest

# The run's names load on first use: reading the plan's defaults (the CLI's help)
# does not load the JSON-RPC client and the databases' drivers.
_RUN_NAMES = frozenset({"IngestOptions", "IngestProgress", "IngestSummary", "ingest"})


def __getattr__(name: str) -> object:
    if name in _RUN_NAMES:
        from blockx_chain.ingest import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BadNodeAnswer",
    "DeepReorgRefused",
    "FilterRefused",
    "GapRefused",
    "IngestError",
    "IngestOptions",
    "IngestProgress",
    "IngestSummary",
    "NodeUnusable",
    "ReorgTooDeep",
    "ingest",
]
