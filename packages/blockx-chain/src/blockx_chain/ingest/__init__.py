"""Chain ingest: fill the block database from an Ethereum node, reorg-aware.

``await ingest(rpc_url, db_url, IngestOptions(...))`` runs once (or follows the
head until ``stop`` is set) and returns an ``IngestSummary``; see
``blockx_chain.ingest.run`` for the run and ``blockx_chain.ingest.plan`` for its
decisions.
"""

from __future__ import annotations

from blockx_chain.ingest.errors import (
    DeepReorgRefused,
    GapRefused,
    IngestError,
    NodeUnusable,
    ReorgTooDeep,
)
from blockx_chain.ingest.run import IngestOptions, IngestProgress, IngestSummary, ingest

__all__ = [
    "DeepReorgRefused",
    "GapRefused",
    "IngestError",
    "IngestOptions",
    "IngestProgress",
    "IngestSummary",
    "NodeUnusable",
    "ReorgTooDeep",
    "ingest",
]
