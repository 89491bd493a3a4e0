"""Real mainnet blocks, as nodes answered for them, ingested through a scripted node.

tests/chain/mainnet/ holds recorded answers of Ethereum mainnet (each file says
where it was recorded): the genesis block in Parity's format, two Homestead blocks
of 2016 with pre-Byzantium receipts (a ``root``, no ``status``), a Shanghai block
of 2023 with its 16 withdrawals and a Prague block with blob gas,
``parentBeaconBlockRoot`` and ``requestsHash``. Every header hashes to the block's
hash (checked here with anvil's ``web3_sha3``), so none is made up. anvil cannot
serve these fields (its withdrawals are always empty, it serves ``requestsHash``
only under prague), so a scripted node serves the recordings.

The L2 block (a deposit of type 0x7e and a type this schema does not know) is made
up, shaped like an OP Stack node's answers: no real chain is claimed for it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio
from rpc_scripted import ScriptedRpcServer, answer, each

from blockx_chain.devnet import Anvil
from blockx_chain.ingest import BadNodeAnswer, IngestOptions, ingest
from blockx_chain.ingest.rows import block_rows
from blockx_chain.rpc import JsonRpcClient, RpcError
from blockx_chain.sink import SinkRejected
from blockx_chain.sink.schema import writable_table
from blockx_chain.store import BlockStore, TooManyRows, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.calls import CallContext
from blockx_core.code_view import CodeSnapshot
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.config import open_router
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders.block_bundle import BlockBundleCallConfig
from blockx_server.pipeline.context import TaskContext

MAINNET: Final = Path(__file__).parent / "mainnet"


def recorded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MAINNET / name).read_text())
    return loaded


GENESIS: Final = recorded("genesis.json")["blocks"][0]
ERAS: Final = ("homestead_1755634.json", "shanghai_18677381.json", "prague_24630100.json")


def q(value: str) -> int:
    return int(value, 16)


class RecordedNode:
    """A node that has the genesis block and one recording's blocks (its head the
    last of them, and finalized), and answers for them as it was recorded."""

    def __init__(self, blocks: list[dict[str, Any]], receipts: dict[str, Any], chain_id: int):
        self.blocks = {q(b["number"]): b for b in [GENESIS, *blocks]}
        self.receipts = {q(n): r for n, r in receipts.items()}
        self.head = max(self.blocks)
        self.chain_id = chain_id

    async def __call__(self, request: Any) -> tuple[int, bytes]:
        return 200, each(request, lambda r: answer(r, self.answer(r["method"], r["params"])))

    def _block(self, param: str, full: bool) -> dict[str, Any] | None:
        number = self.head if param in ("latest", "finalized", "safe") else q(param)
        block = self.blocks.get(number)
        if block is None or full:
            return block
        return {**block, "transactions": [tx["hash"] for tx in block["transactions"]]}

    def answer(self, method: str, params: list[Any]) -> Any:
        match method:
            case "eth_chainId":
                return hex(self.chain_id)
            case "eth_blockNumber":
                return hex(self.head)
            case "eth_getBlockByNumber":
                return self._block(params[0], params[1])
            case "eth_getBlockReceipts":
                return self.receipts.get(q(params[0]), [] if q(params[0]) == 0 else None)
        raise AssertionError(f"the recorded node does not serve {method}")


@pytest_asyncio.fixture
async def store(db_url: str) -> AsyncIterator[BlockStore]:
    opened = await open_store(parse_blockdb_url(db_url))
    yield opened
    await opened.close()


async def ingest_recorded(db_url: str, node: RecordedNode, first: int) -> None:
    async with ScriptedRpcServer(node) as server:
        await ingest(
            server.url,
            parse_blockdb_url(db_url),
            IngestOptions(from_block=first, to_block=node.head, confirmations=0),
        )


# -- the recordings are real ---------------------------------------------------------


def _rlp_length(length: int, offset: int) -> bytes:
    if length < 56:
        return bytes([offset + length])
    size = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([offset + 55 + len(size)]) + size


def _rlp_bytes(data: bytes) -> bytes:
    return data if len(data) == 1 and data[0] < 0x80 else _rlp_length(len(data), 0x80) + data


def _rlp_quantity(value: str) -> bytes:
    number = q(value)
    return _rlp_bytes(number.to_bytes((number.bit_length() + 7) // 8, "big"))


def _rlp_data(value: str) -> bytes:
    return _rlp_bytes(bytes.fromhex(value[2:]))


# The header's fields in RLP order; each era's header ends where its fields stop.
HEADER: Final = (
    ("parentHash", _rlp_data),
    ("sha3Uncles", _rlp_data),
    ("miner", _rlp_data),
    ("stateRoot", _rlp_data),
    ("transactionsRoot", _rlp_data),
    ("receiptsRoot", _rlp_data),
    ("logsBloom", _rlp_data),
    ("difficulty", _rlp_quantity),
    ("number", _rlp_quantity),
    ("gasLimit", _rlp_quantity),
    ("gasUsed", _rlp_quantity),
    ("timestamp", _rlp_quantity),
    ("extraData", _rlp_data),
    ("mixHash", _rlp_data),
    ("nonce", _rlp_data),
    ("baseFeePerGas", _rlp_quantity),
    ("withdrawalsRoot", _rlp_data),
    ("blobGasUsed", _rlp_quantity),
    ("excessBlobGas", _rlp_quantity),
    ("parentBeaconBlockRoot", _rlp_data),
    ("requestsHash", _rlp_data),
)


def encoded_header(block: dict[str, Any]) -> str:
    body = b"".join(encode(block[name]) for name, encode in HEADER if name in block)
    return "0x" + (_rlp_length(len(body), 0xC0) + body).hex()


@pytest.fixture(scope="module")
def hasher() -> Iterator[Anvil]:
    with Anvil() as node:
        yield node


async def test_every_recorded_header_hashes_to_its_recorded_hash(hasher: Anvil) -> None:
    blocks = [b for name in ("genesis.json", *ERAS) for b in recorded(name)["blocks"]]
    async with JsonRpcClient(hasher.url) as client:
        hashes = [await client.request("web3_sha3", [encoded_header(b)]) for b in blocks]
    assert hashes == [b["hash"] for b in blocks]
    assert len(blocks) == 5


# -- stored as recorded -------------------------------------------------------------


def uint256(value: str | None) -> str | None:
    return None if value is None else str(q(value))


def opt_int(value: str | None) -> int | None:
    return None if value is None else q(value)


def expected_block(block: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_number": q(block["number"]),
        "block_hash": block["hash"],
        "parent_hash": block["parentHash"],
        "timestamp": q(block["timestamp"]),
        "miner": block["miner"],
        "gas_used": q(block["gasUsed"]),
        "gas_limit": q(block["gasLimit"]),
        "base_fee_per_gas": opt_int(block.get("baseFeePerGas")),
        "transaction_count": len(block["transactions"]),
        "nonce": block["nonce"],
        "mix_hash": block["mixHash"],
        "sha3_uncles": block["sha3Uncles"],
        "logs_bloom": block["logsBloom"],
        "transactions_root": block["transactionsRoot"],
        "state_root": block["stateRoot"],
        "receipts_root": block["receiptsRoot"],
        "difficulty": uint256(block["difficulty"]),
        "total_difficulty": uint256(block.get("totalDifficulty")),
        "size": q(block["size"]),
        "extra_data": block["extraData"],
        "withdrawals_root": block.get("withdrawalsRoot"),
        "blob_gas_used": opt_int(block.get("blobGasUsed")),
        "excess_blob_gas": opt_int(block.get("excessBlobGas")),
        "parent_beacon_block_root": block.get("parentBeaconBlockRoot"),
        "requests_hash": block.get("requestsHash"),
        "uncle_count": len(block["uncles"]),
    }


@pytest.mark.parametrize("era", ERAS)
async def test_recorded_mainnet_blocks_are_stored_as_the_node_gave_them(
    era: str, db_url: str, store: BlockStore
) -> None:
    recording = recorded(era)
    blocks = recording["blocks"]
    node = RecordedNode(blocks, recording["receipts"], chain_id=1)
    first = q(blocks[0]["number"])
    await ingest_recorded(db_url, node, first)
    assert await store.blocks(first, node.head) == [expected_block(b) for b in blocks]
    withdrawals = [
        {
            "block_number": q(b["number"]),
            "block_hash": b["hash"],
            "position": position,
            "withdrawal_index": q(w["index"]),
            "validator_index": q(w["validatorIndex"]),
            "address": w["address"],
            "amount": q(w["amount"]),
        }
        for b in blocks
        for position, w in enumerate(b.get("withdrawals", []))
    ]
    assert await store.rows("withdrawals", first, node.head) == withdrawals
    match era:
        case "homestead_1755634.json":
            assert withdrawals == []
            stored = await store.transactions(node.head)
            receipts = recording["receipts"][blocks[-1]["number"]]
            assert [t["receipt_root"] for t in stored] == [r["root"] for r in receipts]
            assert [t["success"] for t in stored] == [None, None]  # no status before Byzantium
            assert [t["cumulative_gas_used"] for t in stored] == [0x8E42, 0xE04A]
            assert [t["gas_price"] for t in stored] == ["20000000000", "20000000000"]
            assert [t["v"] for t in stored] == [27, 27]
            # A quantity's leading zero digit is dropped on the wire; r is 32 bytes.
            assert (
                stored[0]["r"]
                == "0x05cc7374e9fec2746508026549a6f691d5de93b34645dd0172531aa0393ea2b7"
            )
            assert [t["max_fee_per_gas"] for t in stored] == [None, None]
            assert [t["access_list"] for t in stored] == [None, None]
            assert [t["extra"] for t in stored] == [None, None]
            # Over 63 bits: a uint256.
            assert int((await store.block(node.head) or {})["total_difficulty"]) > 2**63
        case "shanghai_18677381.json":
            assert len(withdrawals) == 16
            assert sum(w["amount"] for w in withdrawals) == sum(
                q(w["amount"]) for w in blocks[0]["withdrawals"]
            )
        case "prague_24630100.json":
            (row,) = await store.blocks(first, first)
            assert row["requests_hash"] == (
                "0xe3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
            )
            assert (row["blob_gas_used"], row["excess_blob_gas"]) == (0x40000, 0xA2A720E)
            assert row["total_difficulty"] is None  # post-merge nodes dropped it


async def test_withdrawals_are_bounded_by_blockdb_max_rows(db_url: str) -> None:
    recording = recorded("shanghai_18677381.json")
    node = RecordedNode(recording["blocks"], recording["receipts"], chain_id=1)
    await ingest_recorded(db_url, node, node.head)
    narrow = await open_store(parse_blockdb_url(db_url), max_rows=10, read_only=True)
    try:
        with pytest.raises(TooManyRows, match=r"rows\(withdrawals, .*BLOCKDB_MAX_ROWS"):
            await narrow.rows("withdrawals", node.head)
        only = await narrow.rows("withdrawals", node.head, where={"validator_index": 0xF3ABD})
        assert [w["amount"] for w in only] == [0x383FECE]
    finally:
        await narrow.close()


async def test_the_builders_scan_withdrawals_through_io_blockdb(tmp_path: Path) -> None:
    recording = recorded("shanghai_18677381.json")
    node = RecordedNode(recording["blocks"], recording["receipts"], chain_id=1)
    db_url = f"sqlite:///{tmp_path}/chain.db"
    await ingest_recorded(db_url, node, node.head)
    backend = BlockDbBackend(parse_blockdb_url(db_url), max_rows=100)
    await backend.start()
    try:
        ctx = TaskContext(
            task=TaskInput(task_id="t1", function_call_config=PluginConfig(type="x")),
            deadline_ms=0,
            code=CodeSnapshot(epoch=1, modules={}, functions={}, parse_errors={}),
            io=TaskIoScope(open_router(None, blockdb=backend), "t1"),
        )
        config = {
            "function": "f",
            "table": "withdrawals",
            "fromBlock": node.head,
            "toBlock": node.head,
            "where": {"address": "0xf20b338752976878754518183873602902360704"},
        }
        built = await BlockBundleCallConfig().build(ctx, config)
    finally:
        await backend.close()
    recorded_amounts = [q(w["amount"]) for w in recording["blocks"][0]["withdrawals"]]
    assert [c.args[0]["amount"] for c in built.calls] == recorded_amounts
    assert {c.context for c in built.calls} == {
        CallContext(block_number=node.head, block_hash=recording["blocks"][0]["hash"])
    }


def test_the_sink_never_targets_the_new_chain_tables() -> None:
    with pytest.raises(SinkRejected, match="is a block database table"):
        writable_table("withdrawals")


# -- an L2 deposit and a type nobody knows yet ---------------------------------------

L2_BLOCK_HASH: Final = "0x" + "b2" * 32
DEPOSIT_HASH: Final = "0x" + "d0" * 32
UNKNOWN_HASH: Final = "0x" + "a1" * 32
PLAIN_HASH: Final = "0x" + "c2" * 32


def l2_transactions() -> list[dict[str, Any]]:
    common = {"blockHash": L2_BLOCK_HASH, "blockNumber": "0x1", "input": "0x"}
    deposit = {
        **common,
        "type": "0x7e",
        "hash": DEPOSIT_HASH,
        "transactionIndex": "0x0",
        "sourceHash": "0x" + "5c" * 32,
        "from": "0xdeaddeaddeaddeaddeaddeaddeaddeaddead0001",
        "to": "0x4200000000000000000000000000000000000015",
        "mint": "0x0",
        "value": "0x0",
        "gas": "0xf4240",
        "isSystemTx": False,
        "nonce": "0x1",
        "gasPrice": "0x0",
        "v": "0x0",
        "r": "0x0",
        "s": "0x0",
        "depositReceiptVersion": "0x1",
    }
    unknown = {
        **common,
        "type": "0x6a",
        "hash": UNKNOWN_HASH,
        "transactionIndex": "0x1",
        "from": "0x00000000000000000000000000000000000a4b05",
        "to": "0x00000000000000000000000000000000000a4b05",
        "value": "0x0",
        "gas": "0x0",
        "nonce": "0x0",
        "gasPrice": "0x0",
        "chainId": "0xa4b1",
        "requestId": "0x" + "77" * 32,
        "l1BlockNumber": "0x1234",
    }
    plain = {
        **common,
        "type": "0x2",
        "hash": PLAIN_HASH,
        "transactionIndex": "0x2",
        "from": "0x" + "5e" * 20,
        "to": "0x" + "4e" * 20,
        "value": "0x1",
        "gas": "0x5208",
        "nonce": "0x0",
        "gasPrice": "0x9",
        "maxFeePerGas": "0xa",
        "maxPriorityFeePerGas": "0x1",
        "chainId": "0xa",
        "accessList": [],
        "v": "0x1",
        "r": "0x" + "11" * 32,
        "s": "0x" + "22" * 32,
        "yParity": "0x1",
    }
    return [deposit, unknown, plain]


def l2_receipts() -> list[dict[str, Any]]:
    def receipt(tx_hash: str, index: int, **more: Any) -> dict[str, Any]:
        return {
            "blockHash": L2_BLOCK_HASH,
            "blockNumber": "0x1",
            "transactionHash": tx_hash,
            "transactionIndex": hex(index),
            "status": "0x1",
            "gasUsed": "0x5208",
            "cumulativeGasUsed": hex(0x5208 * (index + 1)),
            "effectiveGasPrice": "0x0",
            "contractAddress": None,
            "logs": [],
            "logsBloom": "0x" + "00" * 256,
            "type": "0x2",
            **more,
        }

    return [
        receipt(DEPOSIT_HASH, 0, type="0x7e", depositNonce="0x2a", depositReceiptVersion="0x1"),
        receipt(UNKNOWN_HASH, 1, type="0x6a", gasUsedForL1="0x0"),
        receipt(PLAIN_HASH, 2, l1Fee="0x3b9aca00", l1GasUsed="0x640"),
    ]


def l2_block() -> dict[str, Any]:
    return {
        "number": "0x1",
        "hash": L2_BLOCK_HASH,
        "parentHash": GENESIS["hash"],
        "timestamp": "0x65000000",
        "miner": "0x4200000000000000000000000000000000000011",
        "gasUsed": "0xf618",
        "gasLimit": "0x1c9c380",
        "baseFeePerGas": "0x7",
        "transactions": l2_transactions(),
        "uncles": [],
    }


async def test_a_deposit_and_an_unknown_type_keep_every_field_in_extra(
    db_url: str, store: BlockStore
) -> None:
    node = RecordedNode([l2_block()], {"0x1": l2_receipts()}, chain_id=10)
    await ingest_recorded(db_url, node, 1)
    deposit, unknown, plain = await store.transactions(1)
    assert deposit["transaction_type"] == 0x7E
    assert json.loads(deposit["extra"]) == {
        "transaction": {
            "sourceHash": "0x" + "5c" * 32,
            "mint": "0x0",
            "isSystemTx": False,
            "depositReceiptVersion": "0x1",
        },
        "receipt": {"depositNonce": "0x2a", "depositReceiptVersion": "0x1"},
    }
    assert (deposit["gas_price"], deposit["v"], deposit["r"]) == ("0", 0, "0x" + "00" * 32)
    assert unknown["transaction_type"] == 0x6A
    assert unknown["chain_id"] == 0xA4B1
    assert json.loads(unknown["extra"]) == {
        "transaction": {"requestId": "0x" + "77" * 32, "l1BlockNumber": "0x1234"},
        "receipt": {"gasUsedForL1": "0x0"},
    }
    assert json.loads(plain["extra"]) == {"receipt": {"l1Fee": "0x3b9aca00", "l1GasUsed": "0x640"}}
    assert (plain["max_fee_per_gas"], plain["y_parity"], plain["access_list"]) == ("10", 1, "[]")
    # A field filter reaches the JSON text as stored.
    rows = await store.rows("transactions", 1, where={"transaction_type": 0x7E})
    assert [r["transaction_hash"] for r in rows] == [DEPOSIT_HASH]


# -- hostile answers: one line naming the field --------------------------------------


def _hostile(change: dict[str, Any], *, tx: bool = False) -> str:
    block = l2_block()
    if tx:
        block["transactions"][2].update(change)
    else:
        block.update(change)
    with pytest.raises(RpcError) as refused:
        block_rows(block, l2_receipts())
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("change", "in_tx", "named"),
    [
        ({"accessList": "none"}, True, "transactions[2].accessList: not a list"),
        ({"blobVersionedHashes": {"a": 1}}, True, "transactions[2].blobVersionedHashes"),
        ({"maxFeePerGas": "ten"}, True, "transactions[2].maxFeePerGas: not a quantity"),
        ({"r": "0x" + "1" * 65}, True, "transactions[2].r: not a quantity"),
        ({"totalDifficulty": 5}, False, ".totalDifficulty: not a quantity"),
        ({"uncles": "0x00"}, False, ".uncles: not a list"),
        ({"withdrawals": [{"index": "0x1"}]}, False, "withdrawals[0]: validatorIndex is missing"),
        ({"withdrawals": ["0x1"]}, False, "withdrawals[0]: not an object"),
    ],
)
def test_a_hostile_field_is_refused_naming_it(
    change: dict[str, Any], in_tx: bool, named: str
) -> None:
    assert named in _hostile(change, tx=in_tx)


async def test_a_hostile_header_hash_stops_ingest_naming_the_column(db_url: str) -> None:
    block = {**l2_block(), "stateRoot": "0x1234"}
    node = RecordedNode([block], {"0x1": l2_receipts()}, chain_id=10)
    with pytest.raises(Exception, match=r"blocks\.state_root of block 1 must be 32 bytes") as e:
        await ingest_recorded(db_url, node, 1)
    assert "\n" not in str(e.value)
    assert not isinstance(e.value, BadNodeAnswer)
