"""The chains a cluster serves, by name: what a task, a sink row and a ledger entry
say they belong to."""

from __future__ import annotations

import re
from typing import Final

import msgspec

# The name of the one chain configured by BLOCKDB_URL / CHAIN_RPC_URL alone.
DEFAULT_CHAIN: Final = "default"

_CHAIN_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# What a chain name may be, in words for the messages that refuse one.
CHAIN_NAME_RULE: Final = "lowercase letters, digits, '-' and '_', up to 63"


def is_chain_name(name: str) -> bool:
    """Whether ``name`` can name a chain (a ``[chains.NAME]`` table, a request's chain)."""
    return _CHAIN_NAME.fullmatch(name) is not None


class Chain(msgspec.Struct, frozen=True):
    """One chain a process serves: the name tasks use for it, and its chain id."""

    name: str
    chain_id: int
