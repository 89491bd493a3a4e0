"""The code that wrote the sink's rows, on both engines: each module set stored once,
a block led to the code of the task that wrote it, a rewrite moving it to the new
code, and code no kept task names removed."""

from __future__ import annotations

import asyncio
import hashlib

import asyncpg
import pytest
from sink_layouts import make_sink_at
from support import wait_until

from blockx_chain.sink import LEDGER, SinkRejected, SinkStore, open_sink
from blockx_chain.sink import code as sink_code
from blockx_chain.url import parse_blockdb_url

TABLE = "volume"
CHAIN = 1


def _code(text: str) -> tuple[str, dict[str, str]]:
    """A module set of one module ``fns`` whose function returns ``text``: its
    digest and sources."""
    sources = {"fns": f"def f(block):\n    return {text!r}\n"}
    return hashlib.sha256(sources["fns"].encode()).hexdigest(), sources


A, B, C = _code("a"), _code("b"), _code("c")


async def _write(
    sink: SinkStore, blocks: list[int], code: tuple[str, dict[str, str]], epoch: int, task: str
) -> None:
    await sink.replace_blocks(
        TABLE,
        CHAIN,
        [(n, f"0x{n:x}{task}", [{"v": n}]) for n in blocks],
        code_epoch=epoch,
        task_id=task,
        now_ms=1000 + epoch,
        code_digest=code[0],
        code_sources=code[1],
    )


async def _stored(sink: SinkStore) -> list[str]:
    async with sink.transaction() as tx:
        rows = await tx.fetch(f"SELECT code_digest FROM {sink_code.CODE_TABLE}", ())
    return sorted(str(r["code_digest"]) for r in rows)


async def _tasks(sink: SinkStore) -> list[str]:
    async with sink.transaction() as tx:
        rows = await tx.fetch(f"SELECT task_id FROM {sink_code.TASK_CODE_TABLE}", ())
    return sorted(str(r["task_id"]) for r in rows)


async def _written_by(sink: SinkStore, block: int) -> tuple[str, int, str | None, str]:
    (entry,) = await sink.code_of(TABLE, block, CHAIN)
    assert entry.code is not None
    return entry.task_id, entry.code_epoch, entry.code.code_digest, entry.code.sources["fns"]


async def test_a_module_set_is_stored_once_and_each_block_leads_to_its_code(
    sink: SinkStore,
) -> None:
    await _write(sink, [1, 2], A, 1, "t1")
    await _write(sink, [3], A, 1, "t2")
    assert await _stored(sink) == [A[0]]
    # Another epoch with other code: both kept, each block with its own.
    await _write(sink, [4, 5], B, 2, "t3")
    assert await _stored(sink) == sorted([A[0], B[0]])
    assert await _written_by(sink, 1) == ("t1", 1, A[0], A[1]["fns"])
    assert await _written_by(sink, 3) == ("t2", 1, A[0], A[1]["fns"])
    assert await _written_by(sink, 5) == ("t3", 2, B[0], B[1]["fns"])
    (entry,) = await sink.code_of(TABLE, 5)
    assert (entry.chain_id, entry.block_hash, entry.written_at_ms) == (CHAIN, "0x5t3", 1002)
    task = await sink.code_of_task("t3")
    assert task is not None
    assert (task.code_digest, task.code_epoch, task.table, task.kind) == (B[0], 2, TABLE, "blocks")
    by_digest = await sink.code_by_digest(A[0])
    assert by_digest is not None
    assert (by_digest.sources, by_digest.task_id) == (A[1], None)
    # Nothing written there, or for that chain.
    assert await sink.code_of(TABLE, 9) == []
    assert await sink.code_of(TABLE, 1, 8453) == []
    assert await sink.code_of_task("t9") is None
    assert await sink.code_by_digest("0" * 64) is None


async def test_a_rewrite_moves_the_block_to_the_new_code_and_unused_code_goes(
    sink: SinkStore,
) -> None:
    await _write(sink, [1, 2, 3], A, 1, "t1")
    # New code rewrites block 1: A stays, task t1 still has blocks 2 and 3.
    await _write(sink, [1], B, 2, "t2")
    assert await _written_by(sink, 1) == ("t2", 2, B[0], B[1]["fns"])
    assert await _written_by(sink, 2) == ("t1", 1, A[0], A[1]["fns"])
    assert await _stored(sink) == sorted([A[0], B[0]])
    # A reorg removes t1's last blocks: its task and its code go.
    assert await sink.delete_blocks(TABLE, CHAIN, [2, 3]) == 2
    assert await _tasks(sink) == ["t2"]
    assert await _stored(sink) == [B[0]]
    # A rewrite of every block of t2 by new code: B goes.
    await _write(sink, [1], C, 3, "t3")
    assert await _tasks(sink) == ["t3"]
    assert await _stored(sink) == [C[0]]
    # The same task run again by other code (a retry on another Worker).
    await _write(sink, [1], A, 4, "t3")
    assert await _written_by(sink, 1) == ("t3", 4, A[0], A[1]["fns"])
    assert await _stored(sink) == [A[0]]
    # A block writer that gives no code leaves its blocks without code, and
    # the code of the task it replaced goes.
    await sink.replace_blocks(TABLE, CHAIN, [(1, "0x1", [])], task_id="t4")
    (entry,) = await sink.code_of(TABLE, 1)
    assert (entry.task_id, entry.code) == ("t4", None)
    assert await _stored(sink) == []


async def test_code_removed_by_another_store_is_stored_again(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    first, second = await open_sink(url), await open_sink(url)
    try:
        await _write(first, [1], A, 1, "t1")
        # The other store rewrites the block: A goes, though the first store knows it.
        await _write(second, [1], B, 1, "t2")
        assert await _stored(first) == [B[0]]
        await _write(first, [2], A, 2, "t3")
        assert await _stored(first) == sorted([A[0], B[0]])
        assert await _written_by(second, 2) == ("t3", 2, A[0], A[1]["fns"])
        # A write rolled back stores nothing; the next one of that code does.
        with pytest.raises(SinkRejected):
            await first.replace_blocks(
                TABLE,
                CHAIN,
                [(3, "0x3", [{"v": "text"}])],
                task_id="t4",
                code_digest=C[0],
                code_sources=C[1],
            )
        assert C[0] not in await _stored(first)
        await _write(first, [3], C, 3, "t4")
        assert await _written_by(second, 3) == ("t4", 3, C[0], C[1]["fns"])
    finally:
        await first.close()
        await second.close()


async def test_upserts_keep_the_newest_tasks_code(
    sink: SinkStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_code, "UPSERT_TASKS_KEPT", 2)
    for i, (name, code) in enumerate((("u1", A), ("u2", B), ("u3", C))):
        await sink.upsert(
            "labels",
            [{"k": name, "v": i}],
            ["k"],
            task_id=name,
            code_epoch=i,
            now_ms=i,
            code_digest=code[0],
            code_sources=code[1],
        )
    assert await _tasks(sink) == ["u2", "u3"]
    assert await _stored(sink) == sorted([B[0], C[0]])
    task = await sink.code_of_task("u3")
    assert task is not None
    assert (task.sources, task.kind, task.table, task.code_epoch) == (C[1], "upsert", "labels", 2)
    # An upsert that gives no code records none.
    await sink.upsert("labels", [{"k": "u4", "v": 4}], ["k"], task_id="u4")
    assert await sink.code_of_task("u4") is None


async def test_code_arguments_are_checked(sink: SinkStore) -> None:
    block = [(1, "0x1", [{"v": 1}])]
    cases: list[tuple[str | None, object, str, str]] = [
        ("xyz", A[1], "t", "is no digest"),
        (None, A[1], "t", "is no digest"),
        (A[0], None, "t", "no object of module names"),
        (A[0], {"fns": 1}, "t", "no object of module names"),
        (A[0], A[1], "", "names its task"),
    ]
    for digest, sources, task, said in cases:
        with pytest.raises(SinkRejected, match=said):
            await sink.replace_blocks(
                TABLE,
                CHAIN,
                block,
                task_id=task,
                code_digest=digest,
                code_sources=sources,  # type: ignore[arg-type]
            )
    assert await sink.rows(TABLE) == []


async def test_a_read_only_store_reads_the_code(db_url: str, sink: SinkStore) -> None:
    await _write(sink, [1], A, 1, "t1")
    reader = await open_sink(parse_blockdb_url(db_url), read_only=True)
    try:
        assert await _written_by(reader, 1) == ("t1", 1, A[0], A[1]["fns"])
        assert await reader.code_of(TABLE, 2) == []
        found = await reader.code_by_digest(A[0])
        assert found is not None
        assert found.sources == A[1]
    finally:
        await reader.close()


async def test_a_sink_of_an_earlier_layout_keeps_code_once_marked(db_url: str) -> None:
    await make_sink_at(db_url, 1, [(1, "0x1", [10]), (2, "0x2", [20])])
    sink = await open_sink(parse_blockdb_url(db_url))
    try:
        # Its blocks were written by a BlockX that kept no code.
        with pytest.raises(SinkRejected, match="before sink rows carried their chain"):
            await sink.code_of(TABLE, 1)
        assert await sink.mark_chain(CHAIN)
        (entry,) = await sink.code_of(TABLE, 1)
        assert entry.code is None
        # The ledger rebuilt with the chain id is indexed by task again.
        async with sink.transaction() as tx:
            indexes = {i.name: i.columns for i in await tx.table_indexes(LEDGER)}
        assert indexes[f"{LEDGER}_by_task"] == ["task_id"]
        await _write(sink, [2], A, 1, "t1")
        assert await _written_by(sink, 2) == ("t1", 1, A[0], A[1]["fns"])
        assert await _stored(sink) == [A[0]]
    finally:
        await sink.close()


async def test_writers_side_by_side_never_lose_the_code_of_a_kept_task(db_url: str) -> None:
    url = parse_blockdb_url(db_url)
    stores = [await open_sink(url) for _ in range(3)]
    codes = [A, B, C]
    try:
        # Rounds of three writes at once, each store rewriting blocks the others
        # wrote with other code: removals meet writes of the same module set.
        for round_ in range(12):
            await asyncio.gather(
                *(
                    _write(
                        store,
                        [1 + (round_ + i) % 4, 5 + i],
                        codes[(round_ + i) % 3],
                        round_,
                        f"r{round_}-{i}",
                    )
                    for i, store in enumerate(stores)
                )
            )
        async with stores[0].transaction() as tx:
            dangling = await tx.fetch(
                f"SELECT task_id FROM {sink_code.TASK_CODE_TABLE} t WHERE NOT EXISTS "
                f"(SELECT 1 FROM {sink_code.CODE_TABLE} c WHERE c.code_digest = t.code_digest)",
                (),
            )
        assert dangling == []
        for block in range(1, 8):
            _, _, digest, source = await _written_by(stores[1], block)
            assert (digest, source) in {(code[0], code[1]["fns"]) for code in codes}
        # Every block rewritten with one code: the others go.
        await _write(stores[2], list(range(1, 8)), A, 99, "last")
        assert await _stored(stores[0]) == [A[0]]
        assert await _tasks(stores[0]) == ["last"]
    finally:
        for store in stores:
            await store.close()


async def test_a_write_waits_for_a_removal_under_way_and_stores_the_code_again(
    postgres_url: str,
) -> None:
    sink = await open_sink(parse_blockdb_url(postgres_url))
    remover = await asyncpg.connect(postgres_url)
    try:
        await _write(sink, [1], A, 1, "t1")
        # Another writer removing A right now: its row locked, deleted, not committed.
        removal = remover.transaction()
        await removal.start()
        await remover.execute(
            f"SELECT 1 FROM {sink_code.CODE_TABLE} WHERE code_digest = $1 FOR UPDATE", A[0]
        )
        await remover.execute(f"DELETE FROM {sink_code.CODE_TABLE} WHERE code_digest = $1", A[0])
        # The store knows A, so it only records its task's row: that waits for the removal.
        write = asyncio.create_task(_write(sink, [2], A, 2, "t2"))

        async def waiting() -> bool:
            rows = await remover.fetch(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            return bool(rows)

        await wait_until(waiting, "the write to wait for the removal's lock")
        assert not write.done()
        await removal.commit()
        await write
        # It found A gone and stored it again: block 2 leads to its code.
        assert await _written_by(sink, 2) == ("t2", 2, A[0], A[1]["fns"])
    finally:
        await remover.close()
        await sink.close()
