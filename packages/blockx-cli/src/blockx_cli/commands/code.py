"""The code that wrote a sink table's rows: ``code``.

Every block write keeps its task's code in the sink (``blockx_chain.sink.code``):
the ledger entry of a block names its task, the task its module set, stored once
per set. This command reads them there, opening the sink read-only: it makes
nothing.

Exit codes: 0 shown; 1 nothing written there, no code kept for it, no such
module, or a sink that refuses the read (a bad table name, a sink whose rows do
not say their chain yet); 2 a bad
flag or URL, or a block several chains wrote without ``--chain-id``; 3 the sink
cannot be read (no SQLite file there, a server that does not answer).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import msgspec
import typer
from rich.markup import escape

from blockx_chain.sink import (
    BlockCode,
    SinkError,
    SinkRejected,
    SinkUnavailable,
    WriteKind,
    WrittenCode,
    open_sink,
)
from blockx_chain.url import BlockDbUrl, describe
from blockx_cli.databases import URL_FORMS, database_url
from blockx_cli.launch import collect_cycles
from blockx_cli.options import JsonOpt
from blockx_cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SERVICE,
    EXIT_USAGE,
    Output,
    console,
    fail,
    print_whole,
)

app = typer.Typer()

_KINDS = {WriteKind.BLOCKS: "block write", WriteKind.UPSERT: "upsert"}


@app.command()
def code(
    table: Annotated[
        str | None, typer.Argument(help="The sink table whose block's code is shown.")
    ] = None,
    block: Annotated[int | None, typer.Argument(min=0, help="The block number.")] = None,
    *,
    sink_db: Annotated[
        str | None,
        typer.Option(
            "--sink-db",
            envvar="SINK_DB_URL",
            help=f"The sink database whose rows' code is read: {URL_FORMS} "
            "(default: SINK_DB_URL, else the running `blockx dev up`'s).",
        ),
    ] = None,
    chain_id: Annotated[
        int | None,
        typer.Option(min=0, help="The chain whose block it is (needed when several wrote it)."),
    ] = None,
    task: Annotated[
        str | None, typer.Option(help="The code one task ran, instead of a block's.")
    ] = None,
    digest: Annotated[
        str | None, typer.Option(help="One module set by its digest, instead of a block's.")
    ] = None,
    module: Annotated[
        str | None, typer.Option(help="Only this module's source (a file stem).")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """The exact code that wrote a block's rows of a sink table: the task that
    wrote them, its code epoch, the digest of its module set and every module's
    source, from the sink itself."""
    asked = [table is not None and block is not None, task is not None, digest is not None]
    if sum(asked) != 1 or (table is None) != (block is None):
        fail(
            "name what to show: TABLE BLOCK, --task TASK_ID or --digest DIGEST (one of them)",
            EXIT_USAGE,
        )
    out = Output(console, json_)
    url, _ = database_url(sink_db, "--sink-db", "SINK_DB_URL", "sink database")
    collect_cycles()
    try:
        entry, found = asyncio.run(_read(url, table, block, chain_id, task, digest))
    except SinkUnavailable as exc:
        fail(str(exc), EXIT_SERVICE)
    except SinkRejected as exc:
        fail(str(exc), EXIT_FAILED)
    except SinkError as exc:
        fail(f"cannot read the code kept in {describe(url)}: {exc}", EXIT_SERVICE)
    if found is None:
        fail(_missing(url, entry, table, block, task, digest), EXIT_FAILED)
    if module is not None and module not in found.sources:
        known = ", ".join(sorted(found.sources)) or "none"
        fail(
            f"the code {found.code_digest} has no module {module!r} (modules: {known})",
            EXIT_FAILED,
        )
    sources = found.sources if module is None else {module: found.sources[module]}
    if out.json_mode:
        shown: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(found, sources=sources))
        block_shown = None if entry is None else msgspec.to_builtins(entry)
        if block_shown is not None:
            del block_shown["code"]
        out.emit({"block": block_shown, "code": shown})
    else:
        _show(entry, found, sources)
    raise typer.Exit(EXIT_OK)


async def _read(
    url: BlockDbUrl,
    table: str | None,
    block: int | None,
    chain_id: int | None,
    task: str | None,
    digest: str | None,
) -> tuple[BlockCode | None, WrittenCode | None]:
    sink = await open_sink(url, read_only=True)
    try:
        if task is not None:
            return None, await sink.code_of_task(task)
        if digest is not None:
            return None, await sink.code_by_digest(digest)
        assert table is not None
        assert block is not None
        entries = await sink.code_of(table, block, chain_id)
    finally:
        await sink.close()
    if len(entries) > 1:
        chains = ", ".join(str(e.chain_id) for e in entries)
        fail(
            f"block {block} of table {table!r} was written for chains {chains}: pass --chain-id",
            EXIT_USAGE,
        )
    if not entries:
        return None, None
    return entries[0], entries[0].code


def _missing(
    url: BlockDbUrl,
    entry: BlockCode | None,
    table: str | None,
    block: int | None,
    task: str | None,
    digest: str | None,
) -> str:
    where = describe(url)
    if entry is not None:
        return (
            f"block {block} of table {table!r} was written by task {entry.task_id!r} "
            f"(code epoch {entry.code_epoch}), but {where} keeps no code for it (written by "
            "a BlockX that kept none, or by a writer that gave none)"
        )
    if task is not None:
        return f"{where} keeps no code for task {task!r}"
    if digest is not None:
        return f"{where} holds no code of digest {digest!r}"
    return f"no block {block} of table {table!r} in the ledger of {where}"


def _show(entry: BlockCode | None, found: WrittenCode, sources: dict[str, str]) -> None:
    if entry is not None:
        console.print(
            f"block [bold]{entry.block_number}[/] of [bold]{escape(entry.table)}[/] "
            f"(chain {entry.chain_id}), hash {escape(entry.block_hash)}",
            highlight=False,
        )
    if found.task_id is not None:
        console.print(
            f"written by task [bold]{escape(found.task_id)}[/] "
            f"({_KINDS[found.kind] if found.kind else '-'} to "
            f"{escape(str(found.table))}), code epoch {found.code_epoch}",
            highlight=False,
        )
    print_whole(console, f"code {found.code_digest}")
    for name, source in sorted(sources.items()):
        if console.is_terminal:
            from rich.syntax import Syntax

            console.rule(f"{name}.py", align="left")
            console.print(Syntax(source, "python", line_numbers=True, word_wrap=True))
        else:
            # Off a terminal the source as it is, for a pipe or a file to keep.
            print_whole(console, f"# ---- {name}.py ----")
            print_whole(console, source.rstrip("\n"))
