"""Chain data: ``chain ingest`` fills the block database from a node (whole blocks,
or with ``--logs`` only the logs asked for), ``chain status`` says what a block
database holds, ``chain devnet`` starts a local anvil full of token transfers.

Exit codes of ``chain ingest``: 0 done (or stopped by SIGINT/SIGTERM after its
transaction); 1 refused (a node's answer that is not what was asked for, another
ingest holds the database, a database of another chain or schema, a gap, a reorg
deeper than allowed or below the finalized block);
2 usage (a malformed URL or flag); 3 the node or the database cannot be reached.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from blockx_chain.ingest.errors import IngestError, NodeUnusable
from blockx_chain.ingest.log_ranges import DEFAULT_MAX_WIDTH, DEFAULT_WIDTH
from blockx_chain.ingest.plan import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONFIRMATIONS,
    DEFAULT_MAX_REORG_DEPTH,
    DEFAULT_POLL_INTERVAL_S,
    MAX_BATCH_SIZE,
)
from blockx_chain.schema import MAX_INTEGER  # a block number is a 63-bit INTEGER column
from blockx_chain.url import BlockDbUrl, InvalidBlockDbUrl, parse_blockdb_url
from blockx_cli.commands import abi
from blockx_cli.launch import collect_cycles
from blockx_cli.output import EXIT_FAILED, EXIT_SERVICE, EXIT_USAGE, Output, console, fail

if TYPE_CHECKING:
    import asyncio

    from rich.live import Live
    from rich.table import Table

    from blockx_chain.ingest import IngestOptions, IngestProgress, IngestSummary

# asyncio, rich's live display and the store load when a command runs: the help of
# ``chain ingest`` needs its options' defaults alone.

# The young generation's threshold of the garbage collector while ingest runs.
INGEST_GC_YOUNG = 10_000

# ``blockx chain ...``
group = typer.Typer(help="Chain data: the block database and a local devnet.", no_args_is_help=True)
group.add_typer(abi.group, name="abi")


def _rpc_url(raw: str | None) -> str:
    if not raw:
        fail("no node: pass --rpc or set CHAIN_RPC_URL", EXIT_USAGE)
    parts = urllib.parse.urlsplit(raw.strip())
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        fail(f"--rpc must be an http:// or https:// URL of a JSON-RPC node (got {raw!r})", 2)
    return raw.strip()


def _ws_url(flag: str | None) -> str | None:
    """``--ws``, else CHAIN_WS_URL (its Setting, read through a ConfigReader); None:
    derived from the HTTP URL."""
    from blockx_chain.url import InvalidWsUrl, parse_ws_url
    from blockx_cli.ingest_settings import read_ws_url
    from blockx_server.runtime.env import ConfigErrors

    if flag is None:
        try:
            return read_ws_url()
        except ConfigErrors as exc:
            fail(f"invalid configuration: {exc}", EXIT_USAGE)
    try:
        return parse_ws_url(flag)
    except InvalidWsUrl as exc:
        fail(f"--ws {exc}", EXIT_USAGE)


def _db_url(raw: str | None) -> BlockDbUrl:
    if not raw:
        fail("no block database: pass --db or set BLOCKDB_URL", EXIT_USAGE)
    try:
        return parse_blockdb_url(raw)
    except InvalidBlockDbUrl as exc:
        fail(f"--db {exc}", EXIT_USAGE)


def _to_block(raw: str) -> int | None:
    if raw == "latest":
        return None
    if raw.isascii() and raw.isdigit():
        return int(raw)
    fail(f"--to must be a block number or latest (got {raw!r})", EXIT_USAGE)


def _hex_list(values: list[str] | None, flag: str, length: int) -> tuple[str, ...]:
    """``--address``/``--topic0`` values: lowercase, sorted, each once."""
    found: set[str] = set()
    for raw in values or []:
        value = raw.strip().lower()
        digits = value[2:]
        if (
            not value.startswith("0x")
            or len(value) != length
            or any(c not in "0123456789abcdef" for c in digits)
        ):
            fail(f"{flag} must be {(length - 2) // 2} bytes of 0x hex, got {raw!r}", EXIT_USAGE)
        found.add(value)
    return tuple(sorted(found))


def _progress_view(progress: IngestProgress | None) -> Table:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("blocks", "blocks/s", "head", "node head", "lag", "finalized", "reorgs"):
        table.add_column(column, justify="right")
    if progress is not None:
        table.add_row(
            str(progress.blocks),
            f"{progress.blocks_per_s:,.0f}",
            "-" if progress.head is None else str(progress.head),
            str(progress.node_head),
            str(progress.lag),
            "-" if progress.finalized is None else str(progress.finalized),
            str(progress.reorgs),
        )
    return table


@contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _quiet_lost_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    from blockx_chain.store.postgres import lost_connection_report

    # A database that dies under the run is reported once, as the run's one line.
    if not lost_connection_report(context):
        loop.default_exception_handler(context)


async def _run(
    rpc: str, db: BlockDbUrl, options: IngestOptions, live: Live | None, chain_id: int | None
) -> IngestSummary:
    import asyncio
    import gc

    from blockx_chain.ingest import ingest  # the node's client and the drivers: only here

    collect_cycles()
    # Every answer decodes to thousands of dicts and lists that live one batch: a
    # collection every 700 new ones (the default) costs about 8 % of the CPU that
    # decoding, converting and checking the rows take; the node on the same cores
    # wants that CPU. Cycles are still collected, every INGEST_GC_YOUNG objects.
    gc.set_threshold(INGEST_GC_YOUNG, 10, 10)
    if chain_id is not None:
        await _check_node_chain(rpc, chain_id)
    asyncio.get_running_loop().set_exception_handler(_quiet_lost_connections)
    stop = asyncio.Event()

    def show(progress: IngestProgress) -> None:
        if live is not None:
            live.update(_progress_view(progress))

    with _stop_on_signals(stop):
        return await ingest(rpc, db, options, stop=stop, on_progress=show)


async def _check_node_chain(rpc: str, chain_id: int) -> None:
    """The node must serve the chain its table names (the database is checked
    against the node by ingest itself)."""
    from blockx_chain.rpc import JsonRpcClient, RpcError

    try:
        async with JsonRpcClient(rpc) as client:
            served = int(await client.request("eth_chainId", []), 16)
    except (RpcError, TypeError, ValueError) as exc:
        raise NodeUnusable(f"cannot read the chain id of the node at {rpc}: {exc}") from None
    if served != chain_id:
        raise IngestError(
            f"the node at {rpc} serves chain id {served}, not the table's chain_id {chain_id}"
        )


def _configured_chain(name: str | None, config: Path | None) -> tuple[str, BlockDbUrl, int]:
    """The node, the database and the chain id of ``[chains.NAME]`` in ``config``."""
    from blockx_server.io.chain_config import chain_in_file
    from blockx_server.runtime.config_file import ConfigFileError

    if name is None or config is None:
        fail("--chain NAME and --config FILE go together", EXIT_USAGE)
    try:
        settings = chain_in_file(config, name)
    except ConfigFileError as exc:
        fail("\n".join(exc.lines), EXIT_USAGE)
    rpc = None if settings.rpc is None else settings.rpc.url
    if rpc is None or settings.blockdb is None:
        fail(
            f"[chains.{name}] of {config} must name both rpc_url and blockdb_url to be ingested",
            EXIT_USAGE,
        )
    assert settings.chain_id is not None
    return rpc, settings.blockdb.url, settings.chain_id


def _exit_code(exc: Exception) -> int:
    from blockx_chain.store import StoreUnavailable

    if isinstance(exc, NodeUnusable | StoreUnavailable):
        return EXIT_SERVICE
    return EXIT_FAILED


@group.command("ingest")
def chain_ingest(
    *,
    rpc: Annotated[
        str | None,
        typer.Option(envvar="CHAIN_RPC_URL", help="The node's JSON-RPC URL (http/https)."),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            envvar="BLOCKDB_URL",
            help="The block database: sqlite:////abs.db, sqlite:///rel.db or "
            "postgresql://user@host:port/db.",
        ),
    ] = None,
    from_block: Annotated[
        int | None,
        typer.Option(
            "--from",
            min=0,
            max=MAX_INTEGER,
            help="First block (default: the stored head + 1, or 0 when empty).",
        ),
    ] = None,
    to: Annotated[str, typer.Option("--to", help="Last block: a number or latest.")] = "latest",
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep tailing the head until SIGINT/SIGTERM.")
    ] = False,
    confirmations: Annotated[
        int, typer.Option(min=0, help="Blocks below the head that count as finalized.")
    ] = DEFAULT_CONFIRMATIONS,
    batch_size: Annotated[
        int,
        typer.Option(
            min=1, max=MAX_BATCH_SIZE, help="Blocks per JSON-RPC batch and per transaction."
        ),
    ] = DEFAULT_BATCH_SIZE,
    max_reorg_depth: Annotated[
        int, typer.Option(min=1, help="The deepest reorg applied; deeper is an error.")
    ] = DEFAULT_MAX_REORG_DEPTH,
    allow_deep_reorg: Annotated[
        bool,
        typer.Option(
            "--allow-deep-reorg",
            help="Apply a reorg below the finalized block (starts a new cache epoch).",
        ),
    ] = False,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            min=0.01,
            max=60.0,
            help="Seconds between looks at the node's head while following.",
        ),
    ] = DEFAULT_POLL_INTERVAL_S,
    ws: Annotated[
        str | None,
        typer.Option(
            "--ws",
            help="With --follow: the node's WebSocket, where new heads are pushed "
            "(eth_subscribe newHeads): ws:// or wss://, or none to poll only (default: "
            "CHAIN_WS_URL, else --rpc with http→ws, https→wss).",
            show_default=False,
        ),
    ] = None,
    traces: Annotated[
        bool,
        typer.Option(
            "--traces",
            help="Ingest every transaction's call frames too (debug_traceBlockByNumber, "
            "or trace_block), and the contracts made inside transactions. A database "
            "ingested with --traces always gets them.",
        ),
    ] = False,
    logs: Annotated[
        bool,
        typer.Option(
            "--logs",
            help="Selective: only the logs of --address/--topic0 (eth_getLogs) and the "
            "headers of their blocks and of the blocks near the head.",
        ),
    ] = False,
    address: Annotated[
        list[str] | None,
        typer.Option("--address", help="With --logs: a contract whose logs to keep (repeat)."),
    ] = None,
    topic0: Annotated[
        list[str] | None,
        typer.Option("--topic0", help="With --logs: an event signature hash to keep (repeat)."),
    ] = None,
    log_range: Annotated[
        int,
        typer.Option(
            "--log-range", min=1, help="With --logs: blocks of the first eth_getLogs (it adapts)."
        ),
    ] = DEFAULT_WIDTH,
    max_log_range: Annotated[
        int,
        typer.Option("--max-log-range", min=1, help="With --logs: the widest eth_getLogs."),
    ] = DEFAULT_MAX_WIDTH,
    max_response_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-response-bytes",
            envvar="RPC_MAX_RESPONSE_BYTES",
            min=1024,
            help="The largest node answer read, in bytes (default 32 MiB); a larger "
            "eth_getLogs answer is split.",
            show_default=False,
        ),
    ] = None,
    chain: Annotated[
        str | None,
        typer.Option(
            "--chain",
            help="Ingest the chain NAME of a Worker's --config file (its chains.NAME "
            "table): its rpc_url into its blockdb_url (instead of --rpc and --db), once "
            "the node serves its chain_id.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="With --chain: the Worker's TOML configuration file."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Fill the block database from a node: batched, resumable and reorg-aware; with
    --logs, only the logs asked for."""
    import asyncio

    from rich.live import Live

    from blockx_chain.ingest import IngestOptions
    from blockx_chain.ingest.log_fetch import LogQuery
    from blockx_chain.rpc import DEFAULT_MAX_RESPONSE_BYTES  # the node's client: only here
    from blockx_chain.store import StoreError

    chain_id: int | None = None
    if chain is not None or config is not None:
        rpc_url, db_url, chain_id = _configured_chain(chain, config)
    else:
        rpc_url, db_url = _rpc_url(rpc), _db_url(db)
    if not logs and (address or topic0):
        fail("--address and --topic0 select logs: pass --logs with them", EXIT_USAGE)
    query = None
    if logs:
        query = LogQuery(
            addresses=_hex_list(address, "--address", 42),
            topic0s=_hex_list(topic0, "--topic0", 66),
        )
    options = IngestOptions(
        from_block=from_block,
        to_block=_to_block(to),
        follow=follow,
        confirmations=confirmations,
        batch_size=batch_size,
        max_reorg_depth=max_reorg_depth,
        allow_deep_reorg=allow_deep_reorg,
        poll_interval_s=poll_interval,
        traces=traces,
        logs=query,
        log_range=log_range,
        max_log_range=max_log_range,
        max_response_bytes=max_response_bytes or DEFAULT_MAX_RESPONSE_BYTES,
        ws_url=_ws_url(ws),
    )
    show_live = console.is_terminal and not json_output
    try:
        if show_live:
            with Live(_progress_view(None), console=console, refresh_per_second=4) as live:
                summary = asyncio.run(_run(rpc_url, db_url, options, live, chain_id))
        else:
            summary = asyncio.run(_run(rpc_url, db_url, options, None, chain_id))
    except (IngestError, StoreError) as exc:
        fail(str(exc), _exit_code(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    data = summary.as_json()
    if json_output:
        Output(console, json_mode=True).emit(data)
        return
    traced = (
        f"{data['traces']} call frames (by {data['trace_method']}), "
        if data["trace_method"] is not None
        else ""
    )
    if summary.log_filter is not None:
        console.print(_selective_line(data, summary.log_filter.describe()), highlight=False)
        return
    console.print(
        f"ingested blocks {data['from']}..{data['to']}: {data['blocks']} blocks, "
        f"{data['transactions']} transactions, {data['logs']} logs, "
        f"{data['erc20_transfers']} ERC-20 transfers, {data['nft_transfers']} NFT transfers, "
        f"{traced}{data['contracts']} contracts created, {data['reorgs']} reorgs "
        f"in {data['seconds']:.1f} s",
        highlight=False,
    )


async def _status(db: BlockDbUrl) -> dict[str, Any]:
    from blockx_chain.store import open_store

    store = await open_store(db, read_only=True)
    try:
        chain, record = await store.chain(), await store.log_filter()
        data: dict[str, Any] = {
            "database": store.description,
            "schema_version": store.schema_version,
            "holds": "nothing yet"
            if chain is None
            else "whole blocks"
            if record is None
            else "logs",
            "log_filter": None if record is None else record.as_json(),
        }
        if chain is not None:
            data |= {
                "chain_id": chain.chain_id,
                "genesis_hash": chain.genesis_hash,
                "head": chain.head_number,
                "head_hash": chain.head_hash,
                "finalized": chain.finalized_number,
                "epoch": chain.epoch,
            }
        return data
    finally:
        await store.close()


@group.command("status")
def chain_status(
    *,
    db: Annotated[
        str | None,
        typer.Option(envvar="BLOCKDB_URL", help="The block database (as for chain ingest)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """What a block database holds: its chain, head, finalized block and epoch, and
    whether it holds whole blocks or only the logs of a filter (--logs)."""
    import asyncio

    from blockx_chain.store import StoreError

    db_url = _db_url(db)
    try:
        collect_cycles()
        data = asyncio.run(_status(db_url))
    except StoreError as exc:
        fail(str(exc), _exit_code(exc))
    if json_output:
        Output(console, json_mode=True).emit(data)
        return
    lines = [f"{data['database']} (schema version {data['schema_version']})"]
    if data["holds"] == "nothing yet":
        lines.append("holds nothing yet: no ingest has written it")
    else:
        lines.append(
            f"chain {data['chain_id']}, head {data['head']}, finalized "
            f"{'-' if data['finalized'] is None else data['finalized']}, epoch {data['epoch']}"
        )
        record = data["log_filter"]
        if record is None:
            lines.append("holds whole blocks: blocks, transactions, logs, erc20_transfers")
        else:
            addresses = ", ".join(record["addresses"]) or "any address"
            topics = ", ".join(record["topic0s"]) or "any"
            lines.append(
                f"holds only logs (blockx chain ingest --logs) of {addresses} with topic0 "
                f"{topics}, from block {record['from_block']}, with their blocks' headers: "
                "no transactions"
            )
    for line in lines:
        console.print(line, highlight=False, markup=False)


def _selective_line(data: dict[str, Any], described: str) -> str:
    low, high = data["log_ranges"]
    queries = (
        "no eth_getLogs"
        if not data["log_requests"]
        else f"{data['log_requests']} eth_getLogs of {low} to {high} blocks, "
        f"{data['log_splits']} refused as too wide"
    )
    if data["rate_limited_s"]:
        queries += f", {data['rate_limited_s']:.1f} s waiting out rate limits"
    return (
        f"scanned blocks {data['from']}..{data['to']} for {described}: {data['logs']} logs, "
        f"{data['erc20_transfers']} ERC-20 transfers, {data['blocks']} block headers, "
        f"{data['reorgs']} reorgs in {data['seconds']:.1f} s ({queries})"
    )


@group.command(
    "devnet",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def chain_devnet(ctx: typer.Context) -> None:
    """Start anvil, deploy test tokens and mine blocks of transfers (the options of
    blockx-chain-devnet; --help lists them)."""
    from blockx_chain.devnet.__main__ import main as devnet_main

    raise typer.Exit(devnet_main(list(ctx.args)))
