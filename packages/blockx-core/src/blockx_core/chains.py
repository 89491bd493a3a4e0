"""The chains a cluster serves, by name: what a task, a sink row and a ledger entry
say they belong to."""

from __future__ import annotations

from typing import Final

import msgspec

# The name of the one chain configured by BLOCKDB_URL / CHAIN_RPC_URL alone.
DEFAULT_CHAIN: Final = "default"


class Chain(msgspec.Struct, frozen=True):
    """One chain a process serves: the name tasks use for it, and its chain id."""

    name: str
    chain_id: int
