"""nft_transfers: derived on write from ERC-721 and ERC-1155 transfer logs, on both
engines. Against a real anvil: the devnet's NFT transfers (721, 1155 single and
batch, an operator moving another's tokens) equal what the node's logs say, decoded
here from their bytes; logs that break a standard's layout, emitted by a contract,
stay in ``logs`` with no nft row and no refusal; the devnet's transactions of types
0 to 3 (a blob among them) are stored. And the migration that adds the table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chain_rows import GENESIS, block_hash, make_block
from hypothesis import given, settings
from hypothesis import strategies as st
from nft_logs import TRANSFER, TRANSFER_BATCH, TRANSFER_SINGLE, decoded_transfers, nft_rows
from schema_versions import make_database_at

from blockx_chain import contracts
from blockx_chain.contracts import (
    emit_log_data,
    raw_logs_deploy_data,
    safe_transfer_from_data,
    set_approval_for_all_data,
)
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient, quantity
from blockx_chain.schema import (
    NFT_TRANSFERS_SINCE,
    SCHEMA_VERSION,
    TRANSFER_BATCH_TOPIC,
    TRANSFER_SINGLE_TOPIC,
    TRANSFER_TOPIC,
    BlockRows,
    Log,
    nft_transfers,
)
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.failures import IoErrorKind
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.config import open_router
from blockx_server.io.errors import IoOk, IoReason

OPERATOR = "0x" + "00" * 12 + "11" * 20
SENDER = "0x" + "00" * 12 + "22" * 20
RECEIVER = "0x" + "00" * 12 + "33" * 20


def word(value: int) -> str:
    return f"{value:064x}"


def batch_data(ids: list[int], values: list[int], *, values_first: bool = False) -> str:
    """TransferBatch's data: two offsets, then the arrays (ids first unless asked)."""
    ids_part = word(len(ids)) + "".join(word(i) for i in ids)
    values_part = word(len(values)) + "".join(word(v) for v in values)
    first, second = (values_part, ids_part) if values_first else (ids_part, values_part)
    at_second = 64 + len(first) // 2
    offsets = (at_second, 64) if values_first else (64, at_second)
    return "0x" + word(offsets[0]) + word(offsets[1]) + first + second


# (what, topics, data, the (token id, amount) pairs expected; [] for no nft row)
LOGS_OF_EVERY_SHAPE: list[tuple[str, list[str], str, list[tuple[int, int]]]] = [
    ("an ERC-721 transfer", [TRANSFER, SENDER, RECEIVER, "0x" + word(7)], "0x", [(7, 1)]),
    (
        "an ERC-1155 single transfer",
        [TRANSFER_SINGLE, OPERATOR, SENDER, RECEIVER],
        "0x" + word(5) + word(2**256 - 1),
        [(5, 2**256 - 1)],
    ),
    (
        "an ERC-1155 batch",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        batch_data([1, 2, 3], [10, 20, 30]),
        [(1, 10), (2, 20), (3, 30)],
    ),
    (
        "a batch whose values come before its ids (valid ABI)",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        batch_data([4, 5], [40, 50], values_first=True),
        [(4, 40), (5, 50)],
    ),
    ("an empty batch", [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER], batch_data([], []), []),
    # Hostile: each breaks its event's layout and yields no row.
    (
        "a batch with more ids than values",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        batch_data([1, 2], [10]),
        [],
    ),
    (
        "a batch whose offset points past its data",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        "0x" + word(2**64) + batch_data([1], [10])[66:],
        [],
    ),
    (
        "a batch whose length runs past its data",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        "0x" + word(64) + word(128) + word(2**255) + word(1) + word(1) + word(10),
        [],
    ),
    (
        "a batch with one word of data",
        [TRANSFER_BATCH, OPERATOR, SENDER, RECEIVER],
        "0x" + word(64),
        [],
    ),
    (
        "a single transfer with three words",
        [TRANSFER_SINGLE, OPERATOR, SENDER, RECEIVER],
        "0x" + word(1) + word(1) + word(1),
        [],
    ),
    (
        "a single transfer with three topics",
        [TRANSFER_SINGLE, OPERATOR, SENDER],
        "0x" + word(1) * 2,
        [],
    ),
    (
        "an ERC-721 transfer with data",
        [TRANSFER, SENDER, RECEIVER, "0x" + word(7)],
        "0x" + word(1),
        [],
    ),
]


def as_log(number: int, index: int, topics: list[str], data: str) -> Log:
    padded = [*topics, None, None, None, None]
    return Log(
        block_number=number,
        log_index=index,
        transaction_index=0,
        transaction_hash="0x" + "77" * 32,
        block_hash=block_hash(number),
        address="0x" + "ab" * 20,
        topic0=padded[0],
        topic1=padded[1],
        topic2=padded[2],
        topic3=padded[3],
        data=data,
    )


@pytest.mark.parametrize(
    ("what", "topics", "data", "pairs"),
    LOGS_OF_EVERY_SHAPE,
    ids=[c[0] for c in LOGS_OF_EVERY_SHAPE],
)
def test_each_shape_of_log_gives_its_rows(
    what: str, topics: list[str], data: str, pairs: list[tuple[int, int]]
) -> None:
    log = msgspec.structs.astuple(as_log(9, 3, topics, data))
    rows = nft_transfers(log)
    assert [(r[2], r[11], r[12]) for r in rows] == [
        (i, str(token_id), str(amount)) for i, (token_id, amount) in enumerate(pairs)
    ], what
    # The test's own decoding of the same log agrees.
    node_log = {"topics": topics, "data": data}
    assert [(t[4], t[5]) for t in decoded_transfers(node_log)] == pairs, what
    for row in rows:
        erc721 = topics[0] == TRANSFER
        assert row[6] == ("erc721" if erc721 else "erc1155")
        assert row[8] == (None if erc721 else "0x" + "11" * 20)
        assert (row[9], row[10]) == ("0x" + "22" * 20, "0x" + "33" * 20)


def _words(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(32, "big") for v in values)


def _mangled_batch(
    pairs: list[tuple[int, int]], short: bool, shift: int, cut: int, tail: bytes
) -> bytes:
    """A TransferBatch encoding of ``pairs`` (one value fewer when ``short``) with its
    first offset moved by ``shift``, its last ``cut`` bytes dropped and ``tail`` added."""
    ids, values = [i for i, _ in pairs], [v for _, v in pairs]
    data = bytes.fromhex(batch_data(ids, values[:-1] if short else values)[2:])
    first = max(int.from_bytes(data[:32], "big") + shift, 0)
    data = first.to_bytes(32, "big") + data[32:]
    return data[: len(data) - cut] + tail


# Data a hostile contract might emit: random bytes, words biased towards the small
# numbers an offset or a length is made of, and batches nearly or exactly right.
UINT = st.integers(0, 2**256 - 1)
HOSTILE_DATA = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(st.integers(0, 400), UINT), max_size=10).map(_words),
    st.lists(UINT, min_size=2, max_size=2).map(_words),
    st.builds(
        _mangled_batch,
        st.lists(st.tuples(UINT, UINT), max_size=4),
        st.sampled_from([False, False, True]),
        st.sampled_from([0, 0, 0, 32, -32, 1, 2**64]),
        st.sampled_from([0, 0, 0, 1, 32]),
        st.sampled_from([b"", b"", b"\x01", bytes(32)]),
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    topic0=st.sampled_from([TRANSFER, TRANSFER_SINGLE, TRANSFER_BATCH]),
    topics=st.sampled_from([4, 4, 4, 3, 1]),
    data=HOSTILE_DATA,
)
def test_no_log_makes_derivation_fail_and_rows_match_an_independent_decoding(
    topic0: str, topics: int, data: bytes
) -> None:
    all_topics = [topic0, OPERATOR, SENDER, RECEIVER][:topics]
    log = msgspec.structs.astuple(as_log(9, 3, all_topics, "0x" + data.hex()))
    rows = nft_transfers(log)
    expected = decoded_transfers({"topics": all_topics, "data": "0x" + data.hex()})
    assert [(r[8], r[9], r[10], int(r[11]), int(r[12])) for r in rows] == [
        (operator, sender, receiver, token_id, amount)
        for _, operator, sender, receiver, token_id, amount in expected
    ]


async def test_the_event_topics_are_the_nodes_keccak(anvil: Anvil) -> None:
    async with JsonRpcClient(anvil.url) as client:
        for topic, signature in (
            (TRANSFER_TOPIC, "Transfer(address,address,uint256)"),
            (TRANSFER_SINGLE_TOPIC, "TransferSingle(address,address,address,uint256,uint256)"),
            (TRANSFER_BATCH_TOPIC, "TransferBatch(address,address,address,uint256[],uint256[])"),
        ):
            hashed = await client.request("web3_sha3", ["0x" + signature.encode().hex()])
            assert hashed == topic, signature
    assert (TRANSFER, TRANSFER_SINGLE, TRANSFER_BATCH) == (
        TRANSFER_TOPIC,
        TRANSFER_SINGLE_TOPIC,
        TRANSFER_BATCH_TOPIC,
    )
    assert contracts.TRANSFER_SINGLE_TOPIC == TRANSFER_SINGLE_TOPIC
    assert contracts.TRANSFER_BATCH_TOPIC == TRANSFER_BATCH_TOPIC


# -- against anvil ------------------------------------------------------------------


class NftChain(msgspec.Struct, frozen=True, kw_only=True):
    head: int
    raw_logs: str  # the contract that emitted LOGS_OF_EVERY_SHAPE, in that order
    raw_logs_block: int
    operator_hash: str  # an ERC-1155 transfer sent by an approved operator
    blob_hash: str


async def _build(url: str) -> NftChain:
    async with JsonRpcClient(url) as client:
        devnet = Devnet(client)
        await devnet.setup(tokens=1)
        assert devnet.nfts is not None
        owner, operator, holder = devnet.accounts[:3]
        deploy = {"from": owner, "gas": quantity(1_000_000), "data": raw_logs_deploy_data()}
        approve = set_approval_for_all_data(operator, True)
        first = await devnet.mine_block(
            [deploy, {"from": owner, "to": devnet.nfts.erc1155, "gas": "0x30d40", "data": approve}]
        )
        [receipt, _] = await client.request("eth_getBlockReceipts", [quantity(first.number)])
        raw_logs = str(receipt["contractAddress"])
        # One sender: the logs come out in the order of LOGS_OF_EVERY_SHAPE.
        emits = [
            {"from": holder, "to": raw_logs, "gas": quantity(200_000), "data": emit_log_data(t, d)}
            for _, t, d, _ in LOGS_OF_EVERY_SHAPE
        ]
        moved = safe_transfer_from_data(owner, holder, 2, 3)
        by_operator = {"from": operator, "to": devnet.nfts.erc1155, "gas": "0x30d40", "data": moved}
        second = await devnet.mine_block([*emits, by_operator])
        receipts = await client.request("eth_getBlockReceipts", [quantity(second.number)])
        assert [r["status"] for r in receipts] == ["0x1"] * len(receipts)
        operator_hash = next(r["transactionHash"] for r in receipts if r["from"] == operator)
        blob = await devnet.mine_blob_block()
        [blob_tx] = (await client.request("eth_getBlockByNumber", [quantity(blob.number), False]))[
            "transactions"
        ]
        return NftChain(
            head=blob.number,
            raw_logs=raw_logs,
            raw_logs_block=second.number,
            operator_hash=operator_hash,
            blob_hash=blob_tx,
        )


@pytest.fixture(scope="module")
def chain(anvil: Anvil) -> NftChain:
    return asyncio.run(_build(anvil.url))


async def _node_logs(url: str, head: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(block, log) for every log of blocks 0..head, the block with its transactions."""
    async with JsonRpcClient(url) as client:
        numbers = [quantity(n) for n in range(head + 1)]
        blocks = await client.batch([("eth_getBlockByNumber", [n, True]) for n in numbers])
        receipts = await client.batch([("eth_getBlockReceipts", [n]) for n in numbers])
    return [
        (block, log)
        for block, block_receipts in zip(blocks, receipts, strict=True)
        for receipt in block_receipts
        for log in receipt["logs"]
    ]


async def test_nft_transfers_are_the_nodes_logs_decoded(
    anvil: Anvil, chain: NftChain, db_url: str
) -> None:
    summary = await ingest(anvil.url, parse_blockdb_url(db_url), IngestOptions(batch_size=3))
    assert summary.to_block == chain.head
    expected = []
    for block, log in await _node_logs(anvil.url, chain.head):
        [tx] = [t for t in block["transactions"] if t["hash"] == log["transactionHash"]]
        expected += nft_rows(int(block["number"], 16), block["hash"], tx, log)
    store = await open_store(parse_blockdb_url(db_url))
    try:
        stored = await store.rows("nft_transfers", 0, chain.head)
        logs = await store.logs(chain.raw_logs_block, address=chain.raw_logs)
        transactions = [tx for n in range(chain.head + 1) for tx in await store.transactions(n)]
        by_token = await store.rows("nft_transfers", 0, chain.head, {"token": chain.raw_logs})
    finally:
        await store.close()
    assert stored == expected
    assert summary.nft_transfers == len(expected)
    devnet_rows = [r for r in stored if r["token"] != chain.raw_logs]
    shapes = {(r["standard"], r["operator"] is None, r["batch_position"]) for r in devnet_rows}
    assert shapes == {("erc721", True, 0), ("erc1155", False, 0), ("erc1155", False, 1)}
    # The devnet's batch: ids 1 and 2, amounts 5 and 7, at positions 0 and 1.
    batch = [r for r in devnet_rows if r["standard"] == "erc1155" and r["batch_position"] == 1]
    [last] = batch
    pair = [r for r in devnet_rows if r["log_index"] == last["log_index"]]
    assert [(r["token_id"], r["amount"]) for r in pair] == [("1", "5"), ("2", "7")]
    # Mints come from the zero address; the operator's transfer names the operator.
    assert any(r["from_address"] == "0x" + "00" * 20 for r in devnet_rows)
    [moved] = [r for r in devnet_rows if r["transaction_hash"] == chain.operator_hash]
    assert moved["operator"] != moved["from_address"]
    assert (moved["token_id"], moved["amount"]) == ("2", "3")

    # Every emitted log is in logs, in order; the nft rows are the well-formed ones'.
    assert [(log["topic0"], log["data"]) for log in logs] == [
        (topics[0], data) for _, topics, data, _ in LOGS_OF_EVERY_SHAPE
    ]
    for log, (what, _, _, pairs) in zip(logs, LOGS_OF_EVERY_SHAPE, strict=True):
        rows = [r for r in by_token if r["log_index"] == log["log_index"]]
        assert [(int(r["token_id"]), int(r["amount"])) for r in rows] == pairs, what

    # Transactions of every type, the blob one included, are stored.
    assert {t["transaction_type"] for t in transactions} == {0, 1, 2, 3}
    [blob] = [t for t in transactions if t["transaction_hash"] == chain.blob_hash]
    assert (blob["transaction_type"], blob["success"]) == (3, 1)


# -- the migration --------------------------------------------------------------------


async def _made_before_nft_transfers(db_url: str) -> None:
    """A database at the schema version before nft_transfers."""
    await make_database_at(db_url, NFT_TRANSFERS_SINCE - 1)


async def test_an_older_database_gains_nft_transfers_on_open(db_url: str) -> None:
    await _made_before_nft_transfers(db_url)
    store = await open_store(parse_blockdb_url(db_url))
    try:
        assert store.schema_version == SCHEMA_VERSION
        block = make_block(4, txs=1)
        batch = as_log(4, 2, LOGS_OF_EVERY_SHAPE[2][1], LOGS_OF_EVERY_SHAPE[2][2])
        async with store.writer() as w:
            await w.init_chain(31337, GENESIS)
            written = await w.insert_blocks(
                [
                    BlockRows(
                        block=block.block,
                        transactions=block.transactions,
                        logs=[*block.logs, batch],
                    )
                ]
            )
        assert written["nft_transfers"] == 3
        rows = await store.rows("nft_transfers", 4, where={"token": "0x" + "ab" * 20})
        assert [(r["batch_position"], r["token_id"]) for r in rows] == [
            (0, "1"),
            (1, "2"),
            (2, "3"),
        ]
    finally:
        await store.close()


async def test_io_blockdb_serves_nft_transfers_within_blockdb_max_rows(tmp_path: Path) -> None:
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    store = await open_store(url)
    block = make_block(4, txs=1)
    batch = as_log(4, 2, LOGS_OF_EVERY_SHAPE[2][1], LOGS_OF_EVERY_SHAPE[2][2])
    async with store.writer() as w:
        await w.init_chain(31337, GENESIS)
        await w.insert_blocks(
            [BlockRows(block=block.block, transactions=block.transactions, logs=[batch])]
        )
    await store.close()
    for max_rows, ok in ((3, True), (2, False)):
        backend = BlockDbBackend(url, max_rows=max_rows)
        await backend.start()
        try:
            io = open_router(None, blockdb=backend)
            outcome = await io.execute("blockdb", "rows", ["nft_transfers", 4], {}, writes=False)
        finally:
            await backend.close()
        assert isinstance(outcome, IoOk) is ok, outcome
        if isinstance(outcome, IoOk):
            rows = msgspec.json.decode(outcome.value_json)
            assert [(r["batch_position"], r["amount"]) for r in rows] == [
                (0, "10"),
                (1, "20"),
                (2, "30"),
            ]
        else:
            assert outcome.kind is IoErrorKind.BAD_REQUEST
            assert "BLOCKDB_MAX_ROWS" in outcome.message
            # What a chain scan narrows its range on; the function sees BAD_REQUEST.
            assert outcome.reason is IoReason.TOO_MANY_ROWS
