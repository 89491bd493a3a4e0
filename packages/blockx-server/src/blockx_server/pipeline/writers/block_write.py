"""``BlockWriteResultHandler`` (``BlockTableWriteHandler`` on the block cluster):
each block's rows replace that block's rows of a sink table.

A function returns a block's rows: a dict (one row), a list of dicts, or None.
The outputs are grouped by the block their call was about (the call context its
Builder gave it); the blocks the task covered are the blocks of its outputs, and
each of them is written, with no rows if its calls returned none, so the ledger
(``_blockx_written``) tells "no rows" from "not written". All blocks go in one
``io.sink.replace_blocks`` transaction.

Before writing, every block's hash is checked against ``io.blockdb``: a block
reorged away during the task fails the write, retryable, and nothing is written.
The check and the commit are not atomic when the sink and the block database are
different databases (``blockx follow`` reconciles what slips between them). A
Worker without ``io.blockdb`` writes unchecked.

Every row is written for the task's chain (``TaskContext.chain``): stamped with
its chain id, it replaces that chain's rows of its block only. A task without a
chain fails, not retryable. A Worker configured with one chain by the shorthand
(``BLOCKDB_URL``) claims the rows of a sink written before rows carried their
chain as that chain's; any other refuses such a sink (``blockx backfill`` and
``follow`` mark it by the blocks' hashes).

``sinkIdentity`` (set by the drivers, ``blockx backfill`` and ``follow``): the
identity of the sink the task was meant for. A Worker whose sink has another one
fails the task, not retryable, before writing anything. ``chainId`` (set by the
drivers too): the chain id of the block database the driver planned from; a
Worker whose task chain has another one fails the task, not retryable, before
writing anything.

The task's code goes with its rows: the digest of the module set it pinned and
each module's source, which the sink keeps with the task once per module set
(``blockx_chain.sink.code``), so a row leads to the exact code that wrote it.

Large outputs are decoded on a thread, off the Worker's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar, assert_never

import msgspec

from blockx_core.calls import RootOutput
from blockx_core.chains import DEFAULT_CHAIN, Chain
from blockx_core.failures import IoErrorKind
from blockx_server.io.errors import IoFailed, IoOk
from blockx_server.pipeline.context import TaskContext
from blockx_server.pipeline.plugins import PluginError, answer_of

T = TypeVar("T")

# The widest block range one canonical-hash read asks for.
CHECK_SPAN: Final = 1000
# Outputs of at least this many bytes of JSON are decoded on a thread.
DECODE_OFF_LOOP_BYTES: Final = 64 * 1024
# Decoding holds the interpreter: two threads keep one large task's outputs from
# delaying every other writer's.
_decoding: Final = ThreadPoolExecutor(2, thread_name_prefix="writer-decode")

BlockRows = tuple[int, str, list[dict[str, Any]]]


class BlockWriteConfig(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    table: str
    key: list[str] | None = None
    columns: dict[str, str] | None = None
    # The identity of the sink the task is meant for (the drivers set it).
    sink_identity: str | None = None
    # The chain id the driver planned the task from (the drivers set it).
    chain_id: int | None = None


def parse_config(config: Any, kind: type[msgspec.Struct], plugin: str) -> Any:
    try:
        return msgspec.convert(config, kind)
    except msgspec.ValidationError as exc:
        raise PluginError.of(f"{plugin} config: {exc}", retryable=False) from None


async def off_loop(outputs: Sequence[RootOutput], work: Callable[[], T]) -> T:
    """``work()``, on a thread when ``outputs`` are large, else at once."""
    if sum(len(output.value_json) for output in outputs) < DECODE_OFF_LOOP_BYTES:
        return work()
    return await asyncio.get_running_loop().run_in_executor(_decoding, work)


def output_rows(output: RootOutput, plugin: str) -> list[dict[str, Any]]:
    """The rows one call returned: a dict, a list of dicts, or None (no rows)."""
    try:
        value = msgspec.json.decode(output.value_json)
    except msgspec.DecodeError as exc:
        raise PluginError.of(
            f"{plugin}: output {output.index} is no JSON: {exc}", retryable=True
        ) from None
    return _rows(output, value, plugin)


def _rows(output: RootOutput, value: Any, plugin: str) -> list[dict[str, Any]]:
    match value:
        case None:
            return []
        case dict():
            return [value]
        case list() if all(isinstance(row, dict) for row in value):
            return value
        case _:
            raise PluginError.of(
                f"{plugin}: call {output.index} returned {type(value).__name__}, not a row "
                "(a dict), a list of rows or None",
                retryable=False,
            )


def _decoded_all(outputs: Sequence[RootOutput]) -> list[Any] | None:
    """Every output's value, decoded as one JSON array (one decoder call instead of
    one per call); None when that does not give one value per output: then each is
    decoded on its own, so the error names the output that is no JSON."""
    try:
        values = msgspec.json.decode(b"[" + b",".join(o.value_json for o in outputs) + b"]")
    except msgspec.DecodeError:
        return None
    return values if isinstance(values, list) and len(values) == len(outputs) else None


def rows_per_block(
    outputs: Sequence[RootOutput], plugin: str, covered: Mapping[int, str] | None = None
) -> list[BlockRows]:
    """Every block the outputs are about, and every block of ``covered`` (block
    number to hash: what a chain Builder scanned, blocks without calls included),
    in block order, each with its rows in call order."""
    blocks: dict[int, BlockRows] = {n: (n, h, []) for n, h in (covered or {}).items()}
    values = _decoded_all(outputs)
    for i, output in enumerate(outputs):
        context = output.context
        if context is None or context.block_number is None or context.block_hash is None:
            raise PluginError.of(
                f"{plugin}: call {output.index} is about no block (its call has no block "
                "number and hash): it writes the outputs of a block Call Builder "
                "(BlockTableCallConfig, BlockBundleCallConfig)",
                retryable=False,
            )
        number, block_hash = context.block_number, context.block_hash
        entry = blocks.setdefault(number, (number, block_hash, []))
        if entry[1] != block_hash:
            raise PluginError.of(
                f"{plugin}: block {number} came with two hashes ({entry[1]}, {block_hash})",
                retryable=False,
            )
        if values is None:
            entry[2].extend(output_rows(output, plugin))
        else:
            entry[2].extend(_rows(output, values[i], plugin))
    return [blocks[n] for n in sorted(blocks)]


async def check_canonical(ctx: TaskContext, blocks: Sequence[BlockRows], plugin: str) -> None:
    """PluginError (retryable) naming the blocks whose hash is no longer the block
    database's; nothing to check against without io.blockdb."""
    numbers = [number for number, _, _ in blocks]
    canonical: dict[int, str] = {}
    start = 0
    while start < len(numbers):
        end = start
        while end + 1 < len(numbers) and numbers[end + 1] - numbers[start] < CHECK_SPAN:
            end += 1
        # The hashes alone, read fresh, never from the read cache, and kept as the
        # backend's value: the answer is used once, here; a cached one would be
        # decoded again from its JSON on the event loop.
        outcome = await ctx.io.request(
            "blockdb", "hashes", [numbers[start], numbers[end]], retry=True, as_json=False
        )
        match outcome:
            case IoFailed(kind=IoErrorKind.UNKNOWN_BACKEND):
                return
            case IoFailed():
                raise PluginError.from_io(outcome, f"{plugin}: checking the blocks are canonical")
            case IoOk():
                rows = outcome.decoded()
            case _:
                assert_never(outcome)
        for row in rows:
            canonical[row["block_number"]] = row["block_hash"]
        start = end + 1
    gone = [(n, h) for n, h, _ in blocks if canonical.get(n) != h]
    if gone:
        shown = ", ".join(f"{n} ({h})" for n, h in gone[:5])
        more = f" and {len(gone) - 5} more" if len(gone) > 5 else ""
        raise PluginError.of(
            f"{plugin}: block {shown}{more} is no longer on the canonical chain (reorged "
            "during the task): nothing was written for it; retry the task",
            retryable=True,
        )


def code_arguments(ctx: TaskContext) -> dict[str, Any]:
    """The task's code for ``io.sink``, which keeps it with the rows: the digest of
    its pinned module set and each module's source."""
    code = ctx.code
    return {
        "code_digest": code.digest,
        "code_sources": {name: module.source for name, module in code.modules.items()},
    }


def task_chain(ctx: TaskContext, plugin: str, expected: int | None) -> Chain:
    """The chain the task's rows belong to; PluginError (not retryable) when the
    task has none, or one whose chain id is not ``expected`` (when given)."""
    chain = ctx.chain
    if chain is None:
        raise PluginError.of(
            f"{plugin}: the task has no chain (this process serves none): a block writer "
            "records the chain of every row it writes",
            retryable=False,
        )
    if expected is not None and chain.chain_id != expected:
        raise PluginError.of(
            f"{plugin}: the task's chain {chain.name!r} is chain id {chain.chain_id} on this "
            f"Worker, but its driver planned it from a block database of chain id {expected} "
            "(compare the Workers' chain configuration with the driver's --db); nothing was "
            "written",
            retryable=False,
        )
    return chain


async def replace_blocks(
    ctx: TaskContext,
    plugin: str,
    config: BlockWriteConfig,
    blocks: Sequence[BlockRows],
    *,
    backend: str = "sink",
) -> dict[str, int]:
    """One ``io.<backend>.replace_blocks`` write (a transaction of ``io.sink``, a
    commit of ``io.iceberg``), after the canonical check."""
    chain = task_chain(ctx, plugin, config.chain_id)
    await check_canonical(ctx, blocks, plugin)
    outcome = await ctx.io.request(
        backend,
        "replace_blocks",
        [],
        {
            "table": config.table,
            "chain_id": chain.chain_id,
            "blocks": [list(block) for block in blocks],
            "key": config.key,
            "columns": config.columns,
            "code_epoch": ctx.code.epoch,
            "task_id": ctx.task_id,
            "now_ms": time.time_ns() // 1_000_000,
            "sink_identity": config.sink_identity,
            # The shorthand configures the one chain a sink's unmarked rows are from.
            "claim_unmarked": chain.name == DEFAULT_CHAIN,
            **code_arguments(ctx),
        },
        retry=True,
    )
    answer = answer_of(outcome, f"{plugin}: writing table {config.table!r}")
    written: dict[str, int] = msgspec.json.decode(answer.value_json)
    return written


class BlockWriteResultHandler:
    """``{"table", "key"?, "columns"?, "sinkIdentity"?, "chainId"?}``; result
    ``{"table", "blocks", "rows"}``."""

    name = "BlockWriteResultHandler"
    # The backend written: the sink database (``io.iceberg`` for the lake's writer).
    backend = "sink"

    async def execute(self, ctx: TaskContext, config: Any, outputs: Sequence[RootOutput]) -> bytes:
        parsed: BlockWriteConfig = parse_config(config, BlockWriteConfig, self.name)
        task_chain(ctx, self.name, parsed.chain_id)
        # Every block the Builder scanned reaches the ledger, with or without rows.
        blocks = await off_loop(
            outputs, lambda: rows_per_block(outputs, self.name, ctx.scan.block_hashes)
        )
        written = {"blocks": 0, "rows": 0}
        if blocks or parsed.sink_identity is not None:
            written = await replace_blocks(ctx, self.name, parsed, blocks, backend=self.backend)
        return msgspec.json.encode({"table": parsed.table, **written})
