"""The lake: block writers' rows in Iceberg tables (pyiceberg and pyarrow).

``await LakeStore.open(LakeConfig(uri=..., warehouse=...))`` opens the Iceberg
tables of one namespace under one catalog (``blockx_chain.lake.config``), with
their ledger, sink identity and job records in a SQL database beside it.
``replace_blocks`` and ``delete_blocks`` are its writes (one catalog commit each,
then the ledger), ``scan`` its read (bounded, at a snapshot), ``written`` the
ledger; see ``blockx_chain.lake.store``. ``lake_of(url, table)`` is the lake a
driver's ``--sink-db`` names, when ``table`` is one of its tables. pyiceberg and
pyarrow are imported only when a lake is used.
"""

from __future__ import annotations

from blockx_chain.lake.config import (
    CATALOG_TYPES,
    DEFAULT_NAMESPACE,
    LakeConfig,
    LakeConfigError,
)
from blockx_chain.lake.store import LAKE_TABLE, LakeStore, TooManyRows, lake_of

__all__ = [
    "CATALOG_TYPES",
    "DEFAULT_NAMESPACE",
    "LAKE_TABLE",
    "LakeConfig",
    "LakeConfigError",
    "LakeStore",
    "TooManyRows",
    "lake_of",
]
