"""What an ingest run can fail with; every message is one line for the user."""

from __future__ import annotations


class IngestError(Exception):
    """Ingest stopped; nothing of the failed batch was written."""


class GapRefused(IngestError):
    """``--from`` lies above the stored head + 1: the database would have a gap."""


class ReorgTooDeep(IngestError):
    """The node's chain left the stored one further down than --max-reorg-depth."""


class DeepReorgRefused(IngestError):
    """A reorg forks below the finalized height and --allow-deep-reorg is off."""


class FilterRefused(IngestError):
    """The run's kind of data is not the database's: whole blocks against a
    selective database, or another log filter than the one it was made with."""


class NodeUnusable(IngestError):
    """The node cannot be reached, or its answers break what ingest relies on."""


class BadNodeAnswer(IngestError):
    """The node answered something other than what was asked for (another block, the
    receipts of other transactions) or not in JSON-RPC's shapes: nothing of it is
    written, and asking again would get the same."""
