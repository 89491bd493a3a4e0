"""Traces and created contracts against a real anvil, on SQLite and PostgreSQL: a
chain of swaps on the devnet's pair (a frame of every kind, a reverted inner call,
contracts created inside transactions) ingested through debug_traceBlockByNumber
and through trace_block (the same anvil behind a proxy that lacks the call
tracer) stores identical rows; rollback removes them; a traced database stays
traced; bad trace answers of a scripted node are refused in one line; a database
of the previous schema migrates, and one holding a table of a new name is
refused."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
from rpc_scripted import ScriptedChain, ScriptedRpcServer, answer, each, error, tx_hash
from schema_versions import make_database_at

from blockx_chain.contracts import (
    PROBE_SELECTOR,
    SIGNATURES,
    SWAP_TOPIC,
    SYNC_TOPIC,
    swap_eth_for_tokens_data,
    swap_tokens_for_eth_data,
)
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.devnet.generator import PROBE_GAS, SWAP_GAS, _send
from blockx_chain.ingest import BadNodeAnswer, IngestError, IngestOptions, IngestSummary, ingest
from blockx_chain.ingest.traces import MAX_DEPTH, TracedTransaction, TraceMethod, block_traces
from blockx_chain.rpc import JsonRpcClient, RpcError, RpcErrorKind, quantity
from blockx_chain.schema import SCHEMA_VERSION, TRACES_SINCE
from blockx_chain.store import SchemaRefused, open_store
from blockx_chain.url import parse_blockdb_url


class Chain:
    def __init__(self, head: int, pair: str, rows: dict[str, list[Any]]) -> None:
        self.head = head
        self.pair = pair
        self.node = rows  # the node's own transactions and receipts, by block


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chain(anvil: Anvil) -> Chain:
    """Token transfers and swaps, and one block holding every kind of trade."""
    async with JsonRpcClient(anvil.url) as client:
        net = Devnet(client)
        await net.setup(tokens=1)
        await net.setup_pair()
        assert net.pair is not None
        await net.mine(4, token_transfers=1, eth_transfers=1, swaps=3)
        a, b = net.accounts[1:3]
        await net.mine_block(
            [
                _send(a, net.pair, SWAP_GAS, data=swap_eth_for_tokens_data(a), value=10**16),
                _send(a, net.pair, SWAP_GAS, data=swap_tokens_for_eth_data(10**18, b)),
                _send(b, net.pair, PROBE_GAS, data=PROBE_SELECTOR, value=10**15),
            ]
        )
        head = int((await net.head())["number"], 16)
        numbers = [quantity(n) for n in range(head + 1)]
        blocks = await client.batch([("eth_getBlockByNumber", [n, True]) for n in numbers])
        receipts = await client.batch([("eth_getBlockReceipts", [n]) for n in numbers])
        # The selectors and topics written out are the node's keccak of their signatures.
        for written, signature in SIGNATURES.items():
            hashed = await client.request("web3_sha3", ["0x" + signature.encode().hex()])
            assert hashed.startswith(written), signature
        return Chain(head, net.pair.lower(), {"blocks": blocks, "receipts": receipts})


@pytest.fixture(scope="module")
def without_call_tracer(anvil: Anvil) -> Iterator[str]:
    """The anvil behind a proxy that lacks debug_traceBlockByNumber, as a node that
    offers only trace_block: its URL."""
    from rpc_scripted import served_in_thread

    http = httpx.AsyncClient()

    async def forward(request: Any) -> tuple[int, bytes]:
        requests = request if isinstance(request, list) else [request]
        hidden = [r for r in requests if r["method"] == "debug_traceBlockByNumber"]
        passed = [r for r in requests if r not in hidden]
        answers = [error(r, -32601, "Method not found") for r in hidden]
        if passed:
            reply = await http.post(anvil.url, json=passed)
            answers += reply.json()
        return 200, json.dumps(answers if isinstance(request, list) else answers[0]).encode()

    with served_in_thread(forward) as url:
        yield url


async def run(url: str, db_url: str, **options: Any) -> IngestSummary:
    return await ingest(url, parse_blockdb_url(db_url), IngestOptions(**options))


async def read(db_url: str, table: str, head: int) -> list[dict[str, Any]]:
    store = await open_store(parse_blockdb_url(db_url))
    try:
        return await store.rows(table, 0, head)
    finally:
        await store.close()


async def _another_database(db_url: str, tmp_path: Path) -> str:
    """A second empty database on ``db_url``'s engine."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path}/other.db"
    base, _, name = db_url.rpartition("/")
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(f"CREATE DATABASE {name}_other")
    finally:
        await conn.close()
    return f"{base}/{name}_other"


async def test_both_methods_store_identical_rows_of_every_frame_kind(
    anvil: Anvil, chain: Chain, without_call_tracer: str, db_url: str, tmp_path: Path
) -> None:
    by_tracer = await run(anvil.url, db_url, traces=True, to_block=chain.head)
    other_db = await _another_database(db_url, tmp_path)
    by_trace_block = await run(without_call_tracer, other_db, traces=True, to_block=chain.head)
    assert by_tracer.trace_method == "debug_traceBlockByNumber"
    assert by_trace_block.trace_method == "trace_block"
    assert by_tracer.traces == by_trace_block.traces > 0
    for table in ("traces", "contracts"):
        assert await read(db_url, table, chain.head) == await read(other_db, table, chain.head)

    traces = await read(db_url, "traces", chain.head)
    assert {t["type"] for t in traces} == {
        "call",
        "delegatecall",
        "staticcall",
        "create",
        "create2",
        "selfdestruct",
    }
    # The transaction's own frame: its gas limit and the receipt's gas used.
    blocks = {int(b["number"], 16): b for b in chain.node["blocks"]}
    receipts = {int(r[0]["blockNumber"], 16): r for r in chain.node["receipts"] if r}
    tops = [t for t in traces if t["trace_index"] == 0]
    assert len(tops) == sum(len(b["transactions"]) for b in blocks.values())
    for top in tops:
        tx = blocks[top["block_number"]]["transactions"][top["transaction_index"]]
        receipt = receipts[top["block_number"]][top["transaction_index"]]
        assert (top["transaction_hash"], top["trace_address"]) == (tx["hash"], "[]")
        assert (top["gas"], top["gas_used"]) == (int(tx["gas"], 16), int(receipt["gasUsed"], 16))
        assert top["from_address"] == tx["from"].lower()
    # probe(): the inner call that reverts keeps its error and its revert data, in a
    # transaction that succeeded; its selfdestructs send the probes' ETH back.
    probe = [t for t in tops if t["input"] == PROBE_SELECTOR][-1]
    frames = [
        t
        for t in traces
        if (t["block_number"], t["transaction_index"])
        == (probe["block_number"], probe["transaction_index"])
    ]
    reverted = [t for t in frames if t["error"] is not None]
    assert [(t["type"], t["error"]) for t in reverted] == [("staticcall", "execution reverted")]
    assert "70726f6265206661696c6564" in reverted[0]["output"]  # "probe failed"
    destroyed = [t for t in frames if t["type"] == "selfdestruct"]
    assert len(destroyed) == 2
    assert {t["to_address"] for t in destroyed} == {probe["from_address"]}
    assert sum(int(t["value"]) for t in destroyed) == 10**15
    assert probe["subtraces"] == len([t for t in frames if t["trace_address"].count(",") == 0]) - 1

    # Contracts: top-level (token, pair) and inside transactions (the pair's quoter,
    # every probe's two), each once, with who made it and how.
    contracts = await read(db_url, "contracts", chain.head)
    made = {c["address"]: c for c in contracts}
    assert len(made) == len(contracts)
    assert (made[chain.pair]["kind"], made[chain.pair]["trace_address"]) == ("create", "[]")
    inside = [c for c in contracts if c["trace_address"] != "[]"]
    assert {c["creator"] for c in inside} == {chain.pair}
    kinds = [c["kind"] for c in inside if c["transaction_hash"] == probe["transaction_hash"]]
    assert kinds == ["create", "create2"]
    for contract in inside:
        frame = next(
            t
            for t in traces
            if (t["block_number"], t["transaction_index"], t["trace_index"])
            == (contract["block_number"], contract["transaction_index"], contract["trace_index"])
        )
        assert (frame["type"], frame["to_address"]) == (contract["kind"], contract["address"])
    # The pair's events are Uniswap V2's.
    logs = await read(db_url, "logs", chain.head)
    topics = {log["topic0"] for log in logs if log["address"] == chain.pair}
    assert topics == {SWAP_TOPIC, SYNC_TOPIC}


async def test_rollback_removes_traces_and_contracts_and_a_traced_database_stays_traced(
    anvil: Anvil, chain: Chain, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path}/chain.db"
    first = await run(anvil.url, db_url, traces=True, to_block=chain.head - 1)
    assert first.contracts > 0
    store = await open_store(parse_blockdb_url(db_url))
    try:
        async with store.writer() as w:
            await w.delete_above(2)
        assert await store.rows("traces", 3, chain.head) == []
        assert await store.rows("contracts", 3, chain.head) == []
        assert await store.holds_traces()
    finally:
        await store.close()
    # Without --traces: the database holds traces, so the blocks get theirs.
    again = await run(anvil.url, db_url, from_block=3, to_block=chain.head)
    assert again.trace_method == "debug_traceBlockByNumber"
    traced = {t["block_number"] for t in await read(db_url, "traces", chain.head)}
    assert traced == {int(b["number"], 16) for b in chain.node["blocks"] if b["transactions"]}


async def test_traces_into_a_database_of_untraced_blocks_is_refused(
    anvil: Anvil, chain: Chain, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path}/chain.db"
    plain = await run(anvil.url, db_url, to_block=3)
    assert (plain.trace_method, plain.traces) == (None, 0)
    with pytest.raises(IngestError) as refused:
        await run(anvil.url, db_url, traces=True)
    assert "holds blocks 0..3 without traces" in str(refused.value)
    assert "\n" not in str(refused.value)


# -- a scripted node's bad trace answers -------------------------------------------

HEAD = 3


def frame(**fields: Any) -> dict[str, Any]:
    base = {
        "type": "CALL",
        "from": "0x" + "5e" * 20,
        "to": "0x" + "70" * 20,
        "gas": "0x5208",
        "gasUsed": "0x5208",
        "input": "0x",
        "value": "0x0",
    }
    return base | fields


def nested(depth: int) -> dict[str, Any]:
    top = frame()
    for _ in range(depth):
        top = frame(calls=[top])
    return top


def parity(number: int, **fields: Any) -> dict[str, Any]:
    base = {
        "action": {
            "callType": "call",
            "from": "0x" + "5e" * 20,
            "to": "0x" + "70" * 20,
            "gas": "0x0",
            "input": "0x",
            "value": "0x0",
        },
        "blockHash": f"0xb1{number:062x}",
        "blockNumber": number,
        "result": {"gasUsed": "0x0", "output": "0x"},
        "subtraces": 0,
        "traceAddress": [],
        "transactionHash": tx_hash(number),
        "transactionPosition": 0,
        "type": "call",
    }
    return base | fields


CALL_TRACER_LIES: list[tuple[Callable[[int], Any], str]] = [
    (lambda n: [], "0 traces for a block of 1 transactions"),
    (
        lambda n: [{"txHash": tx_hash(n + 1), "result": frame()}],
        "the trace of 0x7a" + "0" * 61 + "3, not of",
    ),
    (lambda n: [{"txHash": tx_hash(n), "result": frame(type="JUMP")}], "not a kind of call frame"),
    (
        lambda n: [{"txHash": tx_hash(n), "error": "tracer timeout"}],
        f"the node gave no trace of {tx_hash(2)}: 'tracer timeout'",
    ),
    (lambda n: [{"txHash": tx_hash(n), "result": frame(gasUsed="0x" + "f" * 70)}], "gasUsed"),
]
TRACE_BLOCK_LIES: list[tuple[Callable[[int], Any], str]] = [
    (lambda n: [parity(n, blockNumber=n + 1)], "a frame of block"),
    (lambda n: [parity(n, transactionPosition=1)], "a frame of transaction 1 after transaction -1"),
    (lambda n: [parity(n, subtraces=1)], "has 1 subtraces, but 0 followed it"),
    (lambda n: [parity(n), parity(n, traceAddress=[1])], "traceAddress [1] where [] comes next"),
    (lambda n: [], "frames of 0 of the block's 1 transactions"),
    (lambda n: [parity(n, type="vote")], "not a kind of trace"),
]


@pytest.mark.parametrize(
    ("method", "lie", "expected"),
    [("debug_traceBlockByNumber", lie, words) for lie, words in CALL_TRACER_LIES]
    + [("trace_block", lie, words) for lie, words in TRACE_BLOCK_LIES],
)
async def test_a_bad_trace_answer_is_refused_in_one_line(
    method: str, lie: Callable[[int], Any], expected: str, tmp_path: Path
) -> None:
    chain = ScriptedChain(HEAD)

    async def handler(request: Any) -> tuple[int, bytes]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            if r["method"] in ("debug_traceBlockByNumber", "trace_block"):
                if r["method"] != method:
                    return error(r, -32601, "Method not found")
                number = int(r["params"][0], 16)
                return answer(r, lie(number) if number == 2 else _honest(method, number))
            return answer(r, chain.answer(r["method"], r["params"]))

        return 200, each(request, one)

    async with ScriptedRpcServer(handler) as node:
        with pytest.raises(BadNodeAnswer) as refused:
            await run(node.url, f"sqlite:///{tmp_path}/chain.db", traces=True, batch_size=1)
    message = str(refused.value)
    assert expected in message
    assert f"{method}(0x2)" in message
    assert "\n" not in message


def test_a_call_tree_deeper_than_the_evm_allows_is_refused() -> None:
    """(A JSON answer this deep is refused by the client's decoder before it.)"""
    tx = TracedTransaction(tx_hash(2), 21_000, 21_000)
    answer = [{"txHash": tx_hash(2), "result": nested(MAX_DEPTH + 1)}]
    with pytest.raises(RpcError) as refused:
        block_traces(TraceMethod.CALL_TRACER, answer, 2, f"0xb1{2:062x}", [tx])
    assert refused.value.kind is RpcErrorKind.BAD_ANSWER
    assert "1025 calls deep, deeper than the EVM allows" in refused.value.message
    within = [{"txHash": tx_hash(2), "result": nested(MAX_DEPTH)}]
    rows = block_traces(TraceMethod.CALL_TRACER, within, 2, f"0xb1{2:062x}", [tx])
    assert [len(r.trace_address) for r in rows] == list(range(MAX_DEPTH + 1))


async def test_an_answer_nested_deeper_than_the_decoder_goes_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    chain = ScriptedChain(HEAD)
    deep = '{"type":"CALL","calls":[' * 1100 + '{"type":"CALL"}' + "]}" * 1100

    async def handler(request: Any) -> tuple[int, bytes]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            if r["method"] == "debug_traceBlockByNumber":
                number = int(r["params"][0], 16)
                return answer(r, "DEEP" if number == 2 else _honest(r["method"], number))
            return answer(r, chain.answer(r["method"], r["params"]))

        body = each(request, one).replace(b'"DEEP"', f'[{{"result":{deep}}}]'.encode())
        return 200, body

    async with ScriptedRpcServer(handler) as node:
        with pytest.raises(BadNodeAnswer) as refused:
            await run(node.url, f"sqlite:///{tmp_path}/chain.db", traces=True, batch_size=1)
    message = str(refused.value)
    assert "answered JSON nested deeper than this client decodes" in message
    assert "\n" not in message


def _honest(method: str, number: int) -> Any:
    if method == "trace_block":
        return [parity(number)]
    return [{"txHash": tx_hash(number), "result": frame()}]


# -- the schema ---------------------------------------------------------------------


async def _previous_schema(db_url: str, *, extra: str | None = None) -> None:
    """A database as BlockX made it before the trace tables, on either engine."""
    await make_database_at(db_url, TRACES_SINCE - 1, extra_table=extra)


async def _version(db_url: str) -> int:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(str(parse_blockdb_url(db_url).path))  # type: ignore[union-attr]
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        conn.close()
        return version
    pg = await asyncpg.connect(db_url)
    try:
        found: int = await pg.fetchval("SELECT version FROM blockx_schema")
        return found
    finally:
        await pg.close()


async def test_a_database_of_the_previous_schema_gains_the_trace_tables(db_url: str) -> None:
    await _previous_schema(db_url)
    store = await open_store(parse_blockdb_url(db_url))
    try:
        assert await store.rows("traces", 0, 10) == []
        assert await store.rows("contracts", 0, 10) == []
        assert not await store.holds_traces()
    finally:
        await store.close()
    assert await _version(db_url) == SCHEMA_VERSION


@pytest.mark.parametrize("name", ["traces", "contracts"])
async def test_a_database_holding_a_table_of_a_new_name_is_refused(name: str, db_url: str) -> None:
    await _previous_schema(db_url, extra=name)
    with pytest.raises(SchemaRefused) as refused:
        await open_store(parse_blockdb_url(db_url))
    message = str(refused.value)
    assert f"already holds a table named '{name}'" in message
    assert "\n" not in message
    assert await _version(db_url) == TRACES_SINCE - 1
