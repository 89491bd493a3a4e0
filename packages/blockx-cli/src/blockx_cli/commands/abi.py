"""``blockx chain abi``: the ABI registry of a block database, which ``io.logicalTypes``
and the Builders' ``unit: "event"`` decode logs and calls with.

``abi add NAME (--file ABI.json | --signature "event ...") [--address A ...]``
registers (or replaces) an ABI, for the contracts at ``--address`` only or, without
it, for any contract; ``abi list`` shows the registry; ``abi remove NAME`` drops one.

Exit codes: 0 done; 1 ``remove`` of a name not registered; 2 usage (a malformed
ABI file or signature, a bad name or address: one line, no traceback); 3 the
database cannot be reached.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from blockx_chain.url import BlockDbUrl, InvalidBlockDbUrl, parse_blockdb_url
from blockx_cli.launch import collect_cycles
from blockx_cli.output import EXIT_FAILED, EXIT_SERVICE, EXIT_USAGE, Output, console, fail

if TYPE_CHECKING:
    from blockx_chain.abi.spec import Entry
    from blockx_chain.schema import AbiRecord

group = typer.Typer(
    help="The ABIs io.logicalTypes decodes events and calls with.", no_args_is_help=True
)

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# An ABI file larger than this is no ABI.
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
# How long ``add`` and ``remove`` wait for a running ingest's transaction to end.
WRITER_WAIT_S: Final = 10.0

_DB_HELP: Final = "The block database (as for chain ingest)."


def _db_url(raw: str | None) -> BlockDbUrl:
    if not raw:
        fail("no block database: pass --db or set BLOCKDB_URL", EXIT_USAGE)
    try:
        return parse_blockdb_url(raw)
    except InvalidBlockDbUrl as exc:
        fail(f"--db {exc}", EXIT_USAGE)


def _name(raw: str) -> str:
    if _NAME.fullmatch(raw) is None:
        fail(
            f"an ABI's name is 1 to 64 letters, digits, '_', '.' or '-', starting with a "
            f"letter or digit (got {raw!r})",
            EXIT_USAGE,
        )
    return raw


def _entries(file: Path | None, signatures: list[str] | None) -> list[Entry]:
    from blockx_chain.abi.spec import AbiError, entries_from_json, entry_from_signature

    if (file is None) == (not signatures):
        fail('pass either --file ABI.json or --signature "event ..." (repeatable)', EXIT_USAGE)
    try:
        if file is not None:
            try:
                with file.open("rb") as f:
                    text = f.read(MAX_FILE_BYTES + 1)
            except OSError as exc:
                fail(f"--file {file}: {exc.strerror or exc}", EXIT_USAGE)
            if len(text) > MAX_FILE_BYTES:
                fail(f"--file {file} is larger than {MAX_FILE_BYTES} bytes", EXIT_USAGE)
            entries = entries_from_json(text, str(file))
        else:
            entries = [entry_from_signature(s) for s in signatures or []]
    except AbiError as exc:
        fail(str(exc), EXIT_USAGE)
    if not any(e.type in ("event", "function") for e in entries):
        fail("the ABI has no event and no function: nothing to decode with it", EXIT_USAGE)
    return entries


def _addresses(values: list[str] | None) -> list[str]:
    from blockx_chain.abi.spec import AbiError, check_address

    try:
        return sorted({check_address(v, "--address") for v in values or []})
    except AbiError as exc:
        fail(str(exc), EXIT_USAGE)


async def _write(db: BlockDbUrl, change: Any) -> Any:
    """Run ``change(writer)`` in one writer transaction, waiting up to WRITER_WAIT_S
    for an ingest's transaction to end (ingest holds the writer one batch at a time)."""
    import asyncio

    from blockx_chain.store import WriterBusy, open_store

    store = await open_store(db)
    try:
        deadline = time.monotonic() + WRITER_WAIT_S
        while True:
            try:
                async with store.writer() as writer:
                    return await change(writer)
            except WriterBusy:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await store.close()


def _run(work: Any) -> Any:
    import asyncio

    from blockx_chain.store import StoreError, StoreUnavailable

    collect_cycles()
    try:
        return asyncio.run(work)
    except StoreError as exc:
        fail(str(exc), EXIT_SERVICE if isinstance(exc, StoreUnavailable) else EXIT_FAILED)


@group.command("add")
def abi_add(
    name: Annotated[str, typer.Argument(help='The ABI\'s name, as Builders name it ("abi").')],
    *,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="A compiler's ABI JSON (a list, or an artifact with 'abi')."),
    ] = None,
    signature: Annotated[
        list[str] | None,
        typer.Option(
            "--signature",
            help='A human-readable entry, e.g. "event Transfer(address indexed from, '
            'address indexed to, uint256 value)" (repeat).',
        ),
    ] = None,
    address: Annotated[
        list[str] | None,
        typer.Option("--address", help="Decode only the logs and calls of this contract (repeat)."),
    ] = None,
    db: Annotated[str | None, typer.Option(envvar="BLOCKDB_URL", help=_DB_HELP)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the row as JSON.")] = False,
) -> None:
    """Register an ABI (or replace the one of that name)."""
    from blockx_chain.abi.spec import entries_json

    abi_name = _name(name)
    entries = _entries(file, signature)
    addresses = _addresses(address)
    db_url = _db_url(db)
    document = entries_json(entries)

    async def put(writer: Any) -> AbiRecord:
        record: AbiRecord = await writer.put_abi(abi_name, document, addresses)
        return record

    record: AbiRecord = _run(_write(db_url, put))
    if json_output:
        Output(console, json_mode=True).emit(record.as_json())
        return
    events = sum(e.type == "event" for e in entries)
    functions = len(entries) - events
    where = ", ".join(record.addresses) if record.addresses else "any contract"
    console.print(
        f"registered ABI {record.name}: {events} events, {functions} functions, for {where}",
        highlight=False,
        markup=False,
    )


@group.command("list")
def abi_list(
    *,
    db: Annotated[str | None, typer.Option(envvar="BLOCKDB_URL", help=_DB_HELP)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """The registered ABIs: each one's addresses, events and functions."""
    db_url = _db_url(db)

    async def read() -> list[AbiRecord]:
        from blockx_chain.store import open_store

        store = await open_store(db_url, read_only=True)
        try:
            return await store.abis()
        finally:
            await store.close()

    records: list[AbiRecord] = _run(read())
    listing = [_shown(r) for r in records]
    if json_output:
        Output(console, json_mode=True).emit(listing)
        return
    if not listing:
        console.print("no ABI is registered", highlight=False)
        return
    for item in listing:
        where = ", ".join(item["addresses"]) or "any contract"
        console.print(f"{item['name']} (for {where})", highlight=False, markup=False)
        for text in item["entries"]:
            console.print(f"  {text}", highlight=False, markup=False)


def _shown(record: AbiRecord) -> dict[str, Any]:
    from blockx_chain.abi.spec import AbiError, entries_from_stored

    try:
        entries = entries_from_stored(record.abi, f"registered ABI {record.name!r}")
    except AbiError as exc:
        return {"name": record.name, "addresses": list(record.addresses), "error": str(exc)}
    return {
        "name": record.name,
        "addresses": list(record.addresses),
        "entries": [e.text for e in entries],
    }


@group.command("remove")
def abi_remove(
    name: Annotated[str, typer.Argument(help="The ABI's name.")],
    *,
    db: Annotated[str | None, typer.Option(envvar="BLOCKDB_URL", help=_DB_HELP)] = None,
) -> None:
    """Unregister an ABI: its events and calls are no longer decoded."""
    abi_name = _name(name)
    db_url = _db_url(db)

    async def remove(writer: Any) -> bool:
        removed: bool = await writer.remove_abi(abi_name)
        return removed

    if not _run(_write(db_url, remove)):
        fail(f"no ABI named {abi_name!r} is registered", EXIT_FAILED)
    console.print(f"removed ABI {abi_name}", highlight=False, markup=False)
