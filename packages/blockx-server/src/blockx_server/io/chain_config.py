"""The chains a Worker or Sync Invoker serves, and their checks at start-up.

Several chains are ``[chains.NAME]`` tables of the ``--config`` file::

    [chains.mainnet]
    chain_id = 1
    blockdb_url = "postgresql://blockx@db/mainnet"
    rpc_url = "http://eth-node:8545"

    [chains.base]
    chain_id = 8453
    blockdb_url = "postgresql://blockx@db/base"
    blockdb_executor_url = "postgresql://blockx_sql@db/base"

``blockdb_executor_url`` (BLOCKDB_EXECUTOR_URL in the shorthand) is the read-only
role io.blockdb_executor queries a PostgreSQL block database as; without it that
chain has no io.blockdb_executor (one log line says so), and a role that can write
refuses start-up. One chain can instead be named by BLOCKDB_URL and CHAIN_RPC_URL
alone (the shorthand): the chain ``default``, its chain id read from its block database (the
node's ``eth_chainId`` when there is none). The shorthand and the tables together
are refused: which one wins would be a guess.

Refused with one line each: an unknown key, a missing or bad chain_id, a bad URL,
a table with neither URL, two chains with one chain id; at start-up (``open_chains``)
a block database or node whose chain id is not its entry's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import msgspec

from blockx_chain.store import SchemaRefused
from blockx_chain.url import InvalidBlockDbUrl, PostgresUrl, SqliteUrl, parse_blockdb_url
from blockx_core.chains import CHAIN_NAME_RULE, DEFAULT_CHAIN, Chain, is_chain_name
from blockx_server.io.backends.base import IoBackend
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.blockdb_executor import BlockDbExecutorBackend
from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.backends.meta import MetaBackend
from blockx_server.io.backends.rpc import CHAIN_RPC_URL, RpcBackend, RpcSettings
from blockx_server.io.chain_io import ChainIo
from blockx_server.io.config import (
    BLOCKDB_EXECUTOR_URL,
    BLOCKDB_MAX_ROWS,
    BLOCKDB_URL,
    BlockDbSettings,
    executor_url,
    read_query_limits,
)
from blockx_server.io.errors import BackendError
from blockx_server.io.finality import ChainFinality
from blockx_server.runtime.config_file import ConfigFileError, read_tables
from blockx_server.runtime.env import ConfigError, ConfigReader, EnvironSource, each_error
from blockx_server.runtime.process import StartupError
from blockx_server.runtime.settings import InvalidValue

log = logging.getLogger(__name__)

CHAINS_TABLE: Final = "chains"
CHAIN_KEYS: Final = ("chain_id", "blockdb_url", "rpc_url", "blockdb_executor_url")


class ChainSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One chain: its name, its chain id (None for the shorthand's: read at
    start-up), and where it is read."""

    name: str
    chain_id: int | None
    blockdb: BlockDbSettings | None = None
    rpc: RpcSettings | None = None

    @property
    def shorthand(self) -> bool:
        return self.chain_id is None

    def where(self, key: str) -> str:
        """The setting that gave ``key`` (blockdb_url, rpc_url), for an error line."""
        if self.shorthand:
            return {
                "blockdb_url": BLOCKDB_URL.name,
                "rpc_url": CHAIN_RPC_URL.name,
                "blockdb_executor_url": BLOCKDB_EXECUTOR_URL.name,
            }[key]
        return f"[chains.{self.name}] {key}"


def read_chain_settings(
    reader: ConfigReader, blockdb: BlockDbSettings | None, rpc: RpcSettings
) -> tuple[ChainSettings, ...]:
    """The chains served: the ``[chains.NAME]`` tables, else the shorthand
    (``blockdb``, ``rpc``: BLOCKDB_URL and CHAIN_RPC_URL as read), else none.
    Every bad key or value is reported through ``reader``."""
    # Read before (and reported then when bad): every chain's database obeys them.
    max_rows = (
        reader.get(BLOCKDB_MAX_ROWS)
        if reader.valid(BLOCKDB_MAX_ROWS.name)
        else BLOCKDB_MAX_ROWS.default
    )
    timeout_ms, max_bytes = read_query_limits(reader)
    defaults = BlockDbSettings(
        url=SqliteUrl(Path()),
        max_rows=max_rows,
        query_timeout_ms=timeout_ms,
        query_max_bytes=max_bytes,
    )
    prefix = f"{CHAINS_TABLE}."
    fields: dict[str, dict[str, str]] = {}
    for variable in reader.names_under(prefix):
        name, _, key = variable.removeprefix(prefix).partition(".")
        raw = reader.raw(variable)
        if raw is not None:
            fields.setdefault(name, {})[key] = raw
    if not fields:
        if blockdb is None and rpc.url is None:
            return ()
        node = None if rpc.url is None else rpc
        return (ChainSettings(name=DEFAULT_CHAIN, chain_id=None, blockdb=blockdb, rpc=node),)
    executor = None if blockdb is None else blockdb.executor_url
    for shorthand, value in (
        (BLOCKDB_URL.name, blockdb),
        (CHAIN_RPC_URL.name, rpc.url),
        (BLOCKDB_EXECUTOR_URL.name, executor),
    ):
        if value is not None:
            reader.report(
                shorthand,
                "is the one-chain shorthand and cannot be set with [chains.NAME] tables: "
                "give each chain's URLs in its table",
            )
    chains: list[ChainSettings] = []
    owner_of: dict[int, str] = {}
    for name, table in sorted(fields.items()):
        chain = _read_table(reader, name, table, rpc, defaults)
        if chain is None:
            continue
        assert chain.chain_id is not None
        other = owner_of.setdefault(chain.chain_id, name)
        if other != name:
            reader.report(
                f"{prefix}{name}.chain_id",
                f"is {chain.chain_id}, as [chains.{other}]'s: two chains cannot share a chain id",
            )
            continue
        chains.append(chain)
    return tuple(chains)


def _read_table(
    reader: ConfigReader,
    name: str,
    table: dict[str, str],
    rpc_defaults: RpcSettings,
    blockdb_defaults: BlockDbSettings,
) -> ChainSettings | None:
    where = f"{CHAINS_TABLE}.{name}"
    ok = True
    if not is_chain_name(name):
        reader.report(where, f"is no chain name: {CHAIN_NAME_RULE}")
        ok = False
    for key in table:
        if key not in CHAIN_KEYS:
            reader.report(f"{where}.{key}", f"is no key of a chain (keys: {', '.join(CHAIN_KEYS)})")
            ok = False
    chain_id: int | None = None
    raw_id = table.get("chain_id")
    if raw_id is None:
        reader.report(f"{where}.chain_id", "is missing: every [chains.NAME] names its chain id")
        ok = False
    else:
        try:
            chain_id = int(raw_id)
        except ValueError:
            chain_id = None
        if chain_id is None or chain_id < 1:
            reader.report(f"{where}.chain_id", f"must be an integer >= 1 (got {raw_id!r})")
            ok = False
    blockdb: BlockDbSettings | None = None
    if (raw := table.get("blockdb_url")) is not None:
        try:
            url = parse_blockdb_url(raw)
        except InvalidBlockDbUrl as exc:
            reader.report(f"{where}.blockdb_url", str(exc))
            ok = False
        else:
            blockdb = msgspec.structs.replace(blockdb_defaults, url=url)
    if (raw := table.get("blockdb_executor_url")) is not None:
        key = f"{where}.blockdb_executor_url"
        try:
            executor = executor_url(raw)
        except InvalidValue as exc:
            reader.report(key, exc.rule)
            ok = False
        else:
            if blockdb is None or not isinstance(blockdb.url, PostgresUrl):
                reader.report(key, "is for a PostgreSQL blockdb_url: a SQLite one needs none")
                ok = False
            else:
                blockdb = msgspec.structs.replace(blockdb, executor_url=executor)
    rpc: RpcSettings | None = None
    if (raw := table.get("rpc_url")) is not None:
        try:
            rpc_url = CHAIN_RPC_URL.parse(raw)
        except InvalidValue as exc:
            reader.report(f"{where}.rpc_url", exc.rule)
            ok = False
        else:
            rpc = msgspec.structs.replace(rpc_defaults, url=rpc_url)
    if "blockdb_url" not in table and "rpc_url" not in table:
        reader.report(where, "names neither blockdb_url nor rpc_url: a chain is read from one")
        ok = False
    if not ok or chain_id is None:
        return None
    return ChainSettings(name=name, chain_id=chain_id, blockdb=blockdb, rpc=rpc)


def chain_in_file(path: Path, name: str) -> ChainSettings:
    """``[chains.NAME]`` of a Worker's ``--config`` file (what ``blockx chain ingest
    --chain NAME --config FILE`` ingests), checked as the Worker checks it;
    ConfigFileError (one line per problem) otherwise."""
    reader = ConfigReader(EnvironSource(read_tables(path, CHAINS_TABLE)))
    chains = read_chain_settings(reader, None, RpcSettings())
    try:
        reader.finish()
    except ConfigError as exc:
        raise ConfigFileError([f"{path}: {error}" for error in each_error(exc)]) from None
    for chain in chains:
        if chain.name == name:
            return chain
    names = ", ".join(chain.name for chain in chains) or "none"
    raise ConfigFileError([f"{path} has no table [chains.{name}] (its chains: {names})"])


async def open_chains(
    settings: tuple[ChainSettings, ...], finality_refresh_ms: int
) -> list[ChainIo]:
    """Each chain's backends opened and its chain id checked against its block
    database and its node (each when it answers); StartupError, one line naming the
    chain's entry, for a database or node of another chain."""
    opened: list[ChainIo] = []
    try:
        for chain in settings:
            opened.append(await _open_chain(chain, finality_refresh_ms))
    except BaseException:
        await close_chains(opened)
        raise
    return opened


async def _open_chain(settings: ChainSettings, finality_refresh_ms: int) -> ChainIo:
    blockdb: BlockDbBackend | None = None
    rpc: RpcBackend | None = None
    executor: BlockDbExecutorBackend | None = None
    try:
        chain_id = settings.chain_id
        if settings.blockdb is not None:
            blockdb = BlockDbBackend(settings.blockdb.url, settings.blockdb.max_rows)
            try:
                await blockdb.start()
            except SchemaRefused as exc:
                raise StartupError(f"{settings.where('blockdb_url')}: {exc}") from None
            held = await _database_chain_id(blockdb)
            if held is not None:
                if chain_id is None:
                    chain_id = held
                elif held != chain_id:
                    raise StartupError(
                        f"{settings.where('blockdb_url')}: the block database holds chain id "
                        f"{held}, not the table's chain_id {chain_id}"
                    )
        if settings.rpc is not None and settings.rpc.url is not None:
            rpc = RpcBackend.from_settings(settings.rpc)
            served = await _node_chain_id(rpc)
            if served is not None:
                if chain_id is None:
                    chain_id = served
                elif served != chain_id:
                    what = "the block database's" if settings.shorthand else "the table's chain_id"
                    raise StartupError(
                        f"{settings.where('rpc_url')}: the node serves chain id {served}, not "
                        f"{what} {chain_id}"
                    )
        executor = await _open_executor(settings, chain_id)
    except BaseException:
        if blockdb is not None:
            await blockdb.close()
        if rpc is not None:
            await rpc.aclose()
        raise
    if chain_id is None:
        # Neither answered yet: the id is learnt from the database's chain row.
        log.warning(
            "chain %r: its chain id is unknown until its block database answers",
            settings.name,
        )
    finality = None if blockdb is None else ChainFinality(blockdb, finality_refresh_ms)
    backends: list[IoBackend] = [b for b in (blockdb, rpc, executor) if b is not None]
    chain_io = ChainIo(Chain(settings.name, chain_id or 0), backends, finality)
    chain_io.add(MetaBackend(chain_io, blockdb=blockdb, rpc=rpc, finality=finality))
    if blockdb is not None:
        chain_io.add(LogicalTypesBackend(blockdb))
    return chain_io


async def _open_executor(
    settings: ChainSettings, chain_id: int | None
) -> BlockDbExecutorBackend | None:
    """The chain's io.blockdb_executor: on SQLite always, on PostgreSQL with the
    read-only role's URL (without it, off, and one log line says how to enable it);
    StartupError, naming the setting, for a role that can write or a database of
    another chain than ``chain_id``."""
    blockdb = settings.blockdb
    if blockdb is None:
        return None
    if isinstance(blockdb.url, PostgresUrl) and blockdb.executor_url is None:
        log.info(
            "chain %r: io.blockdb_executor is off: set %s to the URL of a read-only role "
            "(docs/blockdb-executor.md)",
            settings.name,
            settings.where("blockdb_executor_url"),
        )
        return None
    backend = BlockDbExecutorBackend(blockdb.url, blockdb.query_limits(), blockdb.executor_url)
    try:
        await backend.start()
    except SchemaRefused as exc:
        await backend.close()
        raise StartupError(f"{settings.where('blockdb_executor_url')}: {exc}") from None
    held = await backend.chain_id() if blockdb.executor_url is not None else None
    if held is not None and chain_id is not None and held != chain_id:
        await backend.close()
        raise StartupError(
            f"{settings.where('blockdb_executor_url')}: its database holds chain id {held}, "
            f"not {chain_id}: name the block database's own"
        )
    return backend


async def _database_chain_id(blockdb: BlockDbBackend) -> int | None:
    try:
        state = await blockdb.chain()
    except BackendError as exc:
        log.warning("cannot read the chain id of the block database yet: %s", exc)
        return None
    return None if state is None else state.chain_id


async def _node_chain_id(rpc: RpcBackend) -> int | None:
    try:
        served = await rpc.serve("chain_id", [], {})
    except BackendError as exc:
        log.warning("cannot read the node's chain id yet: %s", exc)
        return None
    return served if isinstance(served, int) else None


async def close_chains(chains: list[ChainIo]) -> None:
    for chain_io in chains:
        for backend in chain_io.backends.values():
            if isinstance(backend, BlockDbBackend | BlockDbExecutorBackend):
                await backend.close()
            elif isinstance(backend, RpcBackend):
                await backend.aclose()
