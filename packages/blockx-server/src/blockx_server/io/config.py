"""The IO backends a process starts with, built from its settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.backends.rpc import RpcBackend, RpcSettings
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


def open_router(
    memory_seed_file: Path | None,
    extra: Sequence[IoBackend] = (),
    *,
    rpc: RpcSettings | None = None,
) -> IoRouter:
    """Every backend of the process: ``memory``, ``rpc`` when CHAIN_RPC_URL is set, then
    ``extra`` (tests add their own)."""
    backends: list[IoBackend] = [memory_backend(memory_seed_file)]
    if rpc is not None and rpc.url is not None:
        backends.append(RpcBackend.from_settings(rpc))
    return IoRouter([*backends, *extra])
