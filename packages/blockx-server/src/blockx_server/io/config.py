"""The IO backends a process starts with, built from its settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from blockx_chain.store import DEFAULT_MAX_ROWS, SchemaRefused
from blockx_chain.url import FORMS, BlockDbUrl, InvalidBlockDbUrl, parse_blockdb_url
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.backends.rpc import RpcBackend, RpcSettings
from blockx_server.io.router import IoBackend, IoRouter
from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.process import StartupError
from blockx_server.runtime.settings import InvalidValue, Setting, integer


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
    blockdb: BlockDbBackend | None = None,
    *,
    rpc: RpcSettings | None = None,
) -> IoRouter:
    """Every backend of the process: ``memory``, ``blockdb`` when BLOCKDB_URL is set,
    ``rpc`` when CHAIN_RPC_URL is set, then ``extra`` (tests add their own)."""
    backends: list[IoBackend] = [memory_backend(memory_seed_file)]
    if blockdb is not None:
        backends.append(blockdb)
    if rpc is not None and rpc.url is not None:
        backends.append(RpcBackend.from_settings(rpc))
    return IoRouter([*backends, *extra])


# io.blockdb: the block database.


def _blockdb_url(raw: str) -> BlockDbUrl | None:
    try:
        return parse_blockdb_url(raw)
    except InvalidBlockDbUrl as exc:
        raise InvalidValue(str(exc)) from None


BLOCKDB_URL: Final[Setting[BlockDbUrl | None]] = Setting(
    name="BLOCKDB_URL",
    default=None,
    parse=_blockdb_url,
    help=f"the block database io.blockdb reads ({FORMS}); unset: no io.blockdb",
)
BLOCKDB_MAX_ROWS: Final = Setting(
    name="BLOCKDB_MAX_ROWS",
    default=DEFAULT_MAX_ROWS,
    parse=integer(at_least=1),
    help="the most rows one io.blockdb read answers; a wider range is BAD_REQUEST",
)
BLOCKDB_SETTINGS: Final[tuple[Setting[Any], ...]] = (BLOCKDB_URL, BLOCKDB_MAX_ROWS)


class BlockDbSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: BlockDbUrl
    max_rows: int


def read_blockdb_settings(reader: ConfigReader) -> BlockDbSettings | None:
    """BLOCKDB_URL and BLOCKDB_MAX_ROWS; None when BLOCKDB_URL is unset."""
    url = reader.get(BLOCKDB_URL)
    max_rows = reader.get(BLOCKDB_MAX_ROWS)
    return None if url is None else BlockDbSettings(url=url, max_rows=max_rows)


async def start_blockdb(settings: BlockDbSettings | None) -> BlockDbBackend | None:
    """``io.blockdb`` opened, or None without BLOCKDB_URL; StartupError for a
    database this BlockX may not use (a newer schema, another kind of database)."""
    if settings is None:
        return None
    backend = BlockDbBackend(settings.url, settings.max_rows)
    try:
        await backend.start()
    except SchemaRefused as exc:
        await backend.close()
        raise StartupError(f"BLOCKDB_URL: {exc}") from None
    return backend
