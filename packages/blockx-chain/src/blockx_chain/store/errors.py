"""What the block database can fail with."""

from __future__ import annotations


class StoreError(Exception):
    """A block database failure; the message is one line for the user."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or opened now; a later try may succeed."""


class SchemaRefused(StoreError):
    """The database is not one this BlockX may use: a newer schema, no block
    database at all, or (ChainMismatch) another chain's."""


class ChainMismatch(SchemaRefused):
    """The database holds another chain (chain id or genesis hash)."""


class WriterBusy(StoreError):
    """Another writer (another ingest) holds the database."""


class TooManyRows(StoreError):
    """A read whose answer would exceed the store's row limit: narrow it."""


class NotHeld(StoreError):
    """A read of what a selective database (made by ``blockx chain ingest --logs``)
    does not hold: transactions, or logs outside its filter."""
