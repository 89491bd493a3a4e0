"""The IO backends a process starts with, built from its settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.router import IoBackend, IoRouter
from blockx_server.runtime.process import StartupError


def memory_backend(seed_file: Path | None) -> MemoryBackend:
    """``io.memory``, seeded from IO_MEMORY_SEED_FILE when it is set; StartupError
    when the file does not hold a JSON object."""
    if seed_file is None:
        return MemoryBackend()
    try:
        return MemoryBackend.from_file(seed_file)
    except ValueError as exc:
        raise StartupError(f"IO_MEMORY_SEED_FILE: {exc}") from None


def open_router(memory_seed_file: Path | None, extra: Sequence[IoBackend] = ()) -> IoRouter:
    """Every backend of the process: ``memory``, then ``extra`` (tests add their own)."""
    return IoRouter([memory_backend(memory_seed_file), *extra])
