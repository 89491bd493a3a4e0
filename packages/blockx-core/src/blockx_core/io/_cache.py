"""ReadCache: answers of immutable reads, bounded by bytes, least recently used first out.

Invariants: ``bytes_used`` is the sum of the sizes of the entries held and never
exceeds ``max_bytes``; only answers the caller marks immutable are stored; every
entry belongs to the current epoch of its chain (``set_epoch`` drops the older
ones, and an answer of an older epoch is refused), so a chain reorganisation that
changes the epoch cannot leave a stale answer behind. Each chain a process serves
has its own epoch; a reorganisation of one drops none of another's answers.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Final

import msgspec

# What an entry costs beyond its key and answer bytes (the table slot, the objects).
ENTRY_OVERHEAD_BYTES: Final = 64


class CacheKey(msgspec.Struct, frozen=True):
    """One read: backend, operation, canonical arguments, the chain epoch it was
    read in, and the chain it read ("" for a backend of no chain)."""

    backend: str
    op: str
    arguments: str
    epoch: int
    chain: str = ""

    @property
    def size(self) -> int:
        return len(self.backend) + len(self.op) + len(self.arguments) + len(self.chain)


def canonical_arguments(args: list[Any], kwargs: dict[str, Any]) -> str:
    """The same text for the same arguments, whatever the order of the keyword ones
    (``get("a", default=1)`` and ``get(default=1, key="a")`` are not merged: binding
    names to positions is the backend's business)."""
    return json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"), default=repr)


class ReadCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._epochs: dict[str, int] = {}
        self.bytes_used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()

    @property
    def epoch(self) -> int:
        """The current epoch of the chainless backends (and of a one-chain router)."""
        return self.epoch_of("")

    def epoch_of(self, chain: str) -> int:
        return self._epochs.get(chain, 0)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries

    def items(self) -> Iterator[tuple[CacheKey, bytes]]:
        """The entries, least recently used first (for inspection; no reordering)."""
        return iter(list(self._entries.items()))

    @staticmethod
    def entry_bytes(key: CacheKey, value: bytes) -> int:
        return key.size + len(value) + ENTRY_OVERHEAD_BYTES

    def get(self, key: CacheKey) -> bytes | None:
        """The stored answer (now the most recently used), or None (a miss)."""
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: CacheKey, value: bytes, *, immutable: bool) -> bool:
        """Store an answer; False when it is not stored: a mutable answer, one of an
        older epoch, or one larger than the whole cache."""
        if not immutable or key.epoch != self.epoch_of(key.chain):
            return False
        size = self.entry_bytes(key, value)
        if size > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes_used -= self.entry_bytes(key, old)
        while self.bytes_used + size > self.max_bytes:
            evicted, evicted_value = self._entries.popitem(last=False)
            self.bytes_used -= self.entry_bytes(evicted, evicted_value)
            self.evictions += 1
        self._entries[key] = value
        self.bytes_used += size
        return True

    def set_epoch(self, epoch: int, chain: str = "") -> int:
        """Move ``chain`` to ``epoch``; drop every entry of that chain of another epoch.
        Returns how many."""
        if epoch == self.epoch_of(chain):
            return 0
        self._epochs[chain] = epoch
        stale = [key for key in self._entries if key.chain == chain and key.epoch != epoch]
        for key in stale:
            self.bytes_used -= self.entry_bytes(key, self._entries.pop(key))
        return len(stale)
