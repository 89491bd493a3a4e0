"""The IO subsystem's settings, and the IO backends a process starts with.

Read by every process with IO: the Worker and the Sync Invoker (each reads them in
its own ``config.py``). Each variable is declared once below with its default, rule
and help.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from blockx_chain.lake import CATALOG_TYPES, DEFAULT_NAMESPACE, LakeConfig, LakeConfigError
from blockx_chain.lake.config import SQL, namespace_rule
from blockx_chain.sink import DEFAULT_CHUNK_ROWS
from blockx_chain.store import DEFAULT_MAX_ROWS
from blockx_chain.store.query import DEFAULT_QUERY_MAX_BYTES, DEFAULT_QUERY_TIMEOUT_MS, QueryLimits
from blockx_chain.url import FORMS, BlockDbUrl, InvalidBlockDbUrl, PostgresUrl, parse_blockdb_url
from blockx_core.io import ConcurrencyLimit
from blockx_server.io.backends.base import IoBackend
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.iceberg import IcebergBackend
from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.backends.memory import MemoryBackend
from blockx_server.io.backends.rpc import RpcBackend, RpcSettings
from blockx_server.io.backends.sink import SinkBackend
from blockx_server.io.chain_io import ChainIo
from blockx_server.io.finality import FinalityView
from blockx_server.io.router import IoRouter
from blockx_server.io.settings import IoSettings
from blockx_server.runtime.clock import SYSTEM_CLOCK, Clock
from blockx_server.runtime.env import ConfigReader
from blockx_server.runtime.process import StartupError
from blockx_server.runtime.settings import InvalidValue, Setting, integer, optional_text

T = TypeVar("T")


def _optional_integer(at_least: int) -> Callable[[str], int | None]:
    parse = integer(at_least=at_least)

    def parse_optional(raw: str) -> int | None:
        return parse(raw)

    return parse_optional


IO_CACHE_MAX_BYTES: Final = Setting(
    name="IO_CACHE_MAX_BYTES",
    default=256 * 1024 * 1024,
    parse=integer(at_least=0),
    help="bytes of immutable reads the process caches (0 = no cache)",
)
IO_TASK_MAX_INFLIGHT: Final = Setting(
    name="IO_TASK_MAX_INFLIGHT",
    default=64,
    parse=integer(at_least=1),
    help="backend requests of one task in flight; more wait",
)
IO_BACKEND_MIN_CONCURRENCY: Final = Setting(
    name="IO_BACKEND_MIN_CONCURRENCY",
    default=1,
    parse=integer(at_least=1),
    help="the lowest adaptive concurrency limit of a backend",
)
IO_BACKEND_MAX_CONCURRENCY: Final = Setting(
    name="IO_BACKEND_MAX_CONCURRENCY",
    default=64,
    parse=integer(at_least=1),
    help="the highest adaptive concurrency limit; >= IO_BACKEND_MIN_CONCURRENCY",
)
IO_QUEUE_TIMEOUT_MS: Final[Setting[int | None]] = Setting(
    name="IO_QUEUE_TIMEOUT_MS",
    default=None,
    parse=_optional_integer(at_least=1),
    shown_default="CALL_DEADLINE_MS",
    help="wall time a request may queue for a backend; then retryable UNAVAILABLE",
)
IO_RETRY_MAX_ATTEMPTS: Final = Setting(
    name="IO_RETRY_MAX_ATTEMPTS",
    default=3,
    parse=integer(at_least=1),
    help="attempts of a Builder's read or a Writer's write (1 = no retry)",
)
IO_FINALITY_REFRESH_MS: Final = Setting(
    name="IO_FINALITY_REFRESH_MS",
    default=1000,
    parse=integer(at_least=1),
    help="how often the chain's finalized height and epoch are re-read",
)

IO_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    IO_CACHE_MAX_BYTES,
    IO_TASK_MAX_INFLIGHT,
    IO_BACKEND_MIN_CONCURRENCY,
    IO_BACKEND_MAX_CONCURRENCY,
    IO_QUEUE_TIMEOUT_MS,
    IO_RETRY_MAX_ATTEMPTS,
    IO_FINALITY_REFRESH_MS,
)


def read_io_settings(reader: ConfigReader, call_deadline_ms: int) -> IoSettings:
    """The settings above, read through ``reader`` (which collects the bad ones);
    ``call_deadline_ms`` is IO_QUEUE_TIMEOUT_MS's default."""
    low = reader.get(IO_BACKEND_MIN_CONCURRENCY)
    high = reader.get(IO_BACKEND_MAX_CONCURRENCY)
    if reader.valid(IO_BACKEND_MIN_CONCURRENCY.name, IO_BACKEND_MAX_CONCURRENCY.name) and (
        high < low
    ):
        reader.report(
            IO_BACKEND_MAX_CONCURRENCY.name,
            f"must be >= IO_BACKEND_MIN_CONCURRENCY ({high} < {low})",
        )
    queue_timeout_ms = reader.get(IO_QUEUE_TIMEOUT_MS)
    return IoSettings(
        cache_max_bytes=reader.get(IO_CACHE_MAX_BYTES),
        task_max_inflight=reader.get(IO_TASK_MAX_INFLIGHT),
        backend_min_concurrency=low,
        backend_max_concurrency=max(low, high),
        queue_timeout_ms=queue_timeout_ms if queue_timeout_ms is not None else call_deadline_ms,
        retry_max_attempts=reader.get(IO_RETRY_MAX_ATTEMPTS),
        finality_refresh_ms=reader.get(IO_FINALITY_REFRESH_MS),
    )


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
    sink: SinkBackend | None = None,
    iceberg: IcebergBackend | None = None,
    settings: IoSettings | None = None,
    finality: FinalityView | None = None,
    limits: Callable[[str], ConcurrencyLimit] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    chains: Sequence[ChainIo] = (),
) -> IoRouter:
    """Every backend of the process: ``memory``, ``sink`` when SINK_DB_URL is set,
    ``iceberg`` when ICEBERG_CATALOG_URI is, then ``extra`` (tests add their own),
    and each chain served (``chains``, opened by
    ``blockx_server.io.chain_config.open_chains``: its blockdb, rpc, meta and
    logicalTypes), with the process's read cache and each backend's admission.
    ``blockdb`` (with its logicalTypes) and ``rpc`` are backends of no chain, which
    tests use."""
    backends: list[IoBackend] = [memory_backend(memory_seed_file)]
    if blockdb is not None:
        backends += [blockdb, LogicalTypesBackend(blockdb)]
    if rpc is not None and rpc.url is not None:
        backends.append(RpcBackend.from_settings(rpc))
    if sink is not None:
        backends.append(sink)
    if iceberg is not None:
        backends.append(iceberg)
    return IoRouter(
        [*backends, *extra],
        settings=settings,
        finality=finality,
        limits=limits,
        clock=clock,
        chains=list(chains),
    )


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


# io.blockdb_executor: read-only SQL over the block database.


def executor_url(raw: str) -> PostgresUrl:
    """A PostgreSQL URL of the executor's read-only role."""
    url = _blockdb_url(raw)
    if not isinstance(url, PostgresUrl):
        raise InvalidValue(
            "must be a postgresql:// URL (the read-only role io.blockdb_executor connects "
            "as): a SQLite block database needs none"
        )
    return url


BLOCKDB_QUERY_TIMEOUT_MS: Final[Setting[int | None]] = Setting(
    name="BLOCKDB_QUERY_TIMEOUT_MS",
    default=None,
    parse=_optional_integer(at_least=1),
    shown_default="CALL_DEADLINE_MS",
    help="wall time one io.blockdb_executor query may run; then it is stopped (BAD_REQUEST)",
)
BLOCKDB_QUERY_MAX_BYTES: Final = Setting(
    name="BLOCKDB_QUERY_MAX_BYTES",
    default=DEFAULT_QUERY_MAX_BYTES,
    parse=integer(at_least=1024),
    help="the largest answer (JSON bytes) of one io.blockdb_executor query; more is BAD_REQUEST",
)
BLOCKDB_EXECUTOR_URL: Final[Setting[PostgresUrl | None]] = Setting(
    name="BLOCKDB_EXECUTOR_URL",
    default=None,
    parse=executor_url,
    help="a read-only role's URL io.blockdb_executor queries a PostgreSQL BLOCKDB_URL as; "
    "unset: no io.blockdb_executor on PostgreSQL",
)
BLOCKDB_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    BLOCKDB_URL,
    BLOCKDB_MAX_ROWS,
    BLOCKDB_QUERY_TIMEOUT_MS,
    BLOCKDB_QUERY_MAX_BYTES,
    BLOCKDB_EXECUTOR_URL,
)


class BlockDbSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: BlockDbUrl
    max_rows: int
    # io.blockdb_executor: its limits, and on PostgreSQL its read-only role's URL
    # (None: the backend is off there).
    query_timeout_ms: int = DEFAULT_QUERY_TIMEOUT_MS
    query_max_bytes: int = DEFAULT_QUERY_MAX_BYTES
    executor_url: PostgresUrl | None = None

    def query_limits(self) -> QueryLimits:
        return QueryLimits(
            max_rows=self.max_rows,
            max_bytes=self.query_max_bytes,
            timeout_ms=self.query_timeout_ms,
        )


def _checked(reader: ConfigReader, setting: Setting[T]) -> T:
    """``setting``'s value, or its default once it was reported bad (read by each
    chain: reported once)."""
    return reader.get(setting) if reader.valid(setting.name) else setting.default


def read_query_limits(reader: ConfigReader) -> tuple[int, int]:
    """BLOCKDB_QUERY_TIMEOUT_MS (CALL_DEADLINE_MS when unset) and
    BLOCKDB_QUERY_MAX_BYTES, for every chain's block database."""
    from blockx_server.calls.config import CALL_DEADLINE_MS

    timeout_ms = _checked(reader, BLOCKDB_QUERY_TIMEOUT_MS)
    if timeout_ms is None:
        timeout_ms = _checked(reader, CALL_DEADLINE_MS)
    return timeout_ms, _checked(reader, BLOCKDB_QUERY_MAX_BYTES)


def read_blockdb_settings(reader: ConfigReader) -> BlockDbSettings | None:
    """BLOCKDB_URL with BLOCKDB_MAX_ROWS and the io.blockdb_executor settings; None
    when BLOCKDB_URL is unset."""
    url = reader.get(BLOCKDB_URL)
    max_rows = reader.get(BLOCKDB_MAX_ROWS)
    timeout_ms, max_bytes = read_query_limits(reader)
    executor = reader.get(BLOCKDB_EXECUTOR_URL)
    if executor is not None and not isinstance(url, PostgresUrl):
        reader.report(
            BLOCKDB_EXECUTOR_URL.name,
            "is for a PostgreSQL BLOCKDB_URL; "
            + (
                "BLOCKDB_URL is unset"
                if url is None
                else "a SQLite one is queried read-only with no role: unset it"
            ),
        )
    if url is None:
        return None
    return BlockDbSettings(
        url=url,
        max_rows=max_rows,
        query_timeout_ms=timeout_ms,
        query_max_bytes=max_bytes,
        executor_url=executor if isinstance(url, PostgresUrl) else None,
    )


# io.sink: the sink database Writer Plugins write.


SINK_DB_URL: Final[Setting[BlockDbUrl | None]] = Setting(
    name="SINK_DB_URL",
    default=None,
    parse=_blockdb_url,
    help=f"the sink database Writer Plugins write ({FORMS}); unset: no io.sink",
)
SINK_WRITE_CHUNK_ROWS: Final = Setting(
    name="SINK_WRITE_CHUNK_ROWS",
    default=DEFAULT_CHUNK_ROWS,
    # A SQLite chunk is converted and inserted on the event loop's thread: a bound
    # on how long one holds it (100,000 rows: a few tenths of a second).
    parse=integer(at_least=1, at_most=100_000),
    help="rows a sink write converts and inserts at a time, within its one transaction",
)
SINK_SETTINGS: Final[tuple[Setting[Any], ...]] = (SINK_DB_URL, SINK_WRITE_CHUNK_ROWS)


class SinkSettings(msgspec.Struct, frozen=True, kw_only=True):
    url: BlockDbUrl
    write_chunk_rows: int = DEFAULT_CHUNK_ROWS


def read_sink_settings(reader: ConfigReader) -> SinkSettings | None:
    """SINK_DB_URL and SINK_WRITE_CHUNK_ROWS; None when SINK_DB_URL is unset."""
    url = reader.get(SINK_DB_URL)
    chunk_rows = reader.get(SINK_WRITE_CHUNK_ROWS)
    return None if url is None else SinkSettings(url=url, write_chunk_rows=chunk_rows)


async def start_sink(settings: SinkSettings | None) -> SinkBackend | None:
    """``io.sink`` opened (or to be opened on first write), or None without SINK_DB_URL."""
    if settings is None:
        return None
    backend = SinkBackend(settings.url, chunk_rows=settings.write_chunk_rows)
    await backend.start()
    return backend


# io.iceberg: the lake's Iceberg tables (blockx_chain.lake).


def _catalog_type(raw: str) -> str:
    if raw not in CATALOG_TYPES:
        raise InvalidValue(f"must be one of {', '.join(CATALOG_TYPES)} (got {raw!r})")
    return raw


def _catalog_properties(raw: str) -> dict[str, str]:
    try:
        value = msgspec.json.decode(raw.encode(), type=dict[str, str | int | float | bool])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidValue(
            f"must be a JSON object of pyiceberg catalog properties ({exc})"
        ) from None
    return {
        key: str(item).lower() if isinstance(item, bool) else str(item)
        for key, item in value.items()
    }


def _namespace(raw: str) -> str:
    problem = namespace_rule(raw)
    if problem is not None:
        raise InvalidValue(problem)
    return raw


def _ledger_url(raw: str) -> str | None:
    _blockdb_url(raw)
    return raw


ICEBERG_CATALOG_URI: Final[Setting[str | None]] = Setting(
    name="ICEBERG_CATALOG_URI",
    default=None,
    parse=optional_text,
    help=f"the Iceberg catalog of io.iceberg and IcebergWriteResultHandler: a SQL catalog's "
    f"database ({FORMS}), or a REST catalog's URL; unset: no io.iceberg",
)
ICEBERG_WAREHOUSE: Final[Setting[str | None]] = Setting(
    name="ICEBERG_WAREHOUSE",
    default=None,
    parse=optional_text,
    help="where new tables' files go: a directory, or a file://, s3://... URI "
    "(required for a SQL catalog)",
)
ICEBERG_CATALOG_TYPE: Final = Setting(
    name="ICEBERG_CATALOG_TYPE",
    default=SQL,
    parse=_catalog_type,
    help=f"the catalog's kind: {', '.join(CATALOG_TYPES)}",
)
ICEBERG_CATALOG_PROPERTIES: Final[Setting[dict[str, str]]] = Setting(
    name="ICEBERG_CATALOG_PROPERTIES",
    default={},
    parse=_catalog_properties,
    shown_default="{}",
    help="further pyiceberg catalog properties, a JSON object (credentials, s3.endpoint...)",
)
ICEBERG_NAMESPACE: Final = Setting(
    name="ICEBERG_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    parse=_namespace,
    help="the catalog namespace of the lake's tables",
)
ICEBERG_LEDGER_URL: Final[Setting[str | None]] = Setting(
    name="ICEBERG_LEDGER_URL",
    default=None,
    parse=_ledger_url,
    shown_default="the SQL catalog's database",
    help=f"the SQL database of the lake's ledger, sink identity and job records ({FORMS}); "
    "required for a catalog of another type",
)
ICEBERG_MAX_ROWS: Final = Setting(
    name="ICEBERG_MAX_ROWS",
    default=DEFAULT_MAX_ROWS,
    parse=integer(at_least=1),
    help="the most rows one io.iceberg.scan answers; a wider read is BAD_REQUEST",
)
ICEBERG_SETTINGS: Final[tuple[Setting[Any], ...]] = (
    ICEBERG_CATALOG_URI,
    ICEBERG_WAREHOUSE,
    ICEBERG_CATALOG_TYPE,
    ICEBERG_CATALOG_PROPERTIES,
    ICEBERG_NAMESPACE,
    ICEBERG_LEDGER_URL,
    ICEBERG_MAX_ROWS,
)
# The setting each field of a lake configuration comes from.
_ICEBERG_FIELDS: Final = {
    "uri": ICEBERG_CATALOG_URI.name,
    "warehouse": ICEBERG_WAREHOUSE.name,
    "catalog_type": ICEBERG_CATALOG_TYPE.name,
    "properties": ICEBERG_CATALOG_PROPERTIES.name,
    "namespace": ICEBERG_NAMESPACE.name,
    "ledger_url": ICEBERG_LEDGER_URL.name,
    "max_rows": ICEBERG_MAX_ROWS.name,
}


def read_iceberg_settings(reader: ConfigReader) -> LakeConfig | None:
    """The ICEBERG_* settings as a lake configuration, checked (each problem
    reported naming its variable); None when ICEBERG_CATALOG_URI is unset."""
    values = {field: reader.get(setting) for field, setting in _iceberg_settings().items()}
    if values["uri"] is None or not reader.valid(*_ICEBERG_FIELDS.values()):
        return None
    config = LakeConfig(**values)
    try:
        config.catalog_properties()
    except LakeConfigError as exc:
        reader.report(_ICEBERG_FIELDS[exc.field], exc.message)
        return None
    if config.catalog_type == SQL and config.warehouse is None:
        reader.report(
            ICEBERG_WAREHOUSE.name,
            "must be set for a SQL catalog: the directory (or URI) new tables' files go to",
        )
        return None
    return config


def _iceberg_settings() -> dict[str, Setting[Any]]:
    by_name = {setting.name: setting for setting in ICEBERG_SETTINGS}
    return {field: by_name[name] for field, name in _ICEBERG_FIELDS.items()}


async def start_iceberg(
    config: LakeConfig | None, *, read_only: bool = False
) -> IcebergBackend | None:
    """``io.iceberg`` opened (or to be opened on first use), or None without
    ICEBERG_CATALOG_URI; ``read_only``: for scans alone (see IcebergBackend)."""
    if config is None:
        return None
    backend = IcebergBackend(config, read_only=read_only)
    await backend.start()
    return backend
