"""io.logicalTypes against a real anvil and both block database engines: the devnet's
logs (the pair's Swap and Sync, ERC-20, ERC-721 and ERC-1155 transfers) and calls
decoded to what the contracts emitted and were sent; logs a contract emits at will
(RawLogs) for an anonymous event, indexed arguments of dynamic types and an event
no ABI matches; the registry read anew while the backend runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from eth_abi.abi import encode
from eth_hash.auto import keccak
from prometheus_client import CollectorRegistry
from schema_versions import make_database_at

from blockx_chain.abi.spec import entries_from_json, entries_json, entry_from_signature
from blockx_chain.contracts import (
    SWAP_ETH_FOR_TOKENS_SELECTOR,
    SWAP_TOKENS_FOR_ETH_SELECTOR,
    emit_log_data,
    raw_logs_deploy_data,
)
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient, quantity
from blockx_chain.schema import ABIS_SINCE, SCHEMA_VERSION
from blockx_chain.store import BlockStore, SchemaRefused, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_core.chains import Chain as ChainName
from blockx_core.code_view import CodeSnapshot
from blockx_core.failures import IoErrorKind
from blockx_core.task import PluginConfig, TaskInput
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.chain_io import ChainIo
from blockx_server.io.config import open_router
from blockx_server.io.errors import IoFailed, IoOk
from blockx_server.io.metrics import IoMetrics
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.builders import PluginError
from blockx_server.pipeline.builders.block_bundle import BlockBundleCallConfig
from blockx_server.pipeline.builders.block_table import BlockTableCallConfig
from blockx_server.pipeline.context import TaskContext

PAIR_ABI = [
    "event Swap(address indexed sender, uint256 amount0In, uint256 amount1In, "
    "uint256 amount0Out, uint256 amount1Out, address indexed to)",
    "event Sync(uint112 reserve0, uint112 reserve1)",
    "function swapEthForTokens(address to)",
    "function swapTokensForEth(uint256 amountIn, address to)",
]
ERC20 = ["event Transfer(address indexed from, address indexed to, uint256 value)"]
ERC721 = ["event Transfer(address indexed from, address indexed to, uint256 indexed tokenId)"]
ERC1155 = [
    "event TransferSingle(address indexed operator, address indexed from, address indexed to, "
    "uint256 id, uint256 value)",
    "event TransferBatch(address indexed operator, address indexed from, address indexed to, "
    "uint256[] ids, uint256[] values)",
]
NOTE = "event Note(uint256 indexed id, string text) anonymous"
TAGGED = (
    "event Tagged(string indexed tag, (uint256 a, address b) indexed pair, bytes32 key, "
    "(uint8 n, string s)[] items, int16 delta)"
)


def word(value: int) -> str:
    return f"{value:064x}"


def topic_of(signature: str) -> str:
    return "0x" + keccak(signature.encode()).hex()


# A log no registered ABI describes until the test registers ``Other``.
OTHER_TOPIC = topic_of("Other(uint256,uint256)")


class Chain(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    head: int
    pair: str
    raw_logs: str
    raw_block: int
    tag_hash: str
    pair_hash: str


# What the RawLogs contract emits, in order: the anonymous Note, the Tagged event with
# two hashed topics, and a log no ABI describes.
def _raw_emits(tag_hash: str, pair_hash: str) -> list[tuple[list[str], str]]:
    tagged = entry_from_signature(TAGGED)
    items = [(1, "one"), (255, "\u00e9t\u00e9")]
    return [
        ([word(7)], "0x" + encode(["string"], ["seven"]).hex()),
        (
            [topic_of(tagged.signature), tag_hash, pair_hash],
            "0x" + encode(["bytes32", "(uint8,string)[]", "int16"], [b"k" * 32, items, -3]).hex(),
        ),
        ([OTHER_TOPIC, word(1)], "0x" + word(2)),
    ]


async def _build(url: str) -> Chain:
    async with JsonRpcClient(url) as client:
        devnet = Devnet(client)
        await devnet.setup(tokens=1)
        await devnet.setup_pair()
        await devnet.mine(2, token_transfers=2, eth_transfers=0, swaps=4)
        assert devnet.pair is not None
        owner = devnet.accounts[0]
        deploy = {"from": owner, "gas": quantity(1_000_000), "data": raw_logs_deploy_data()}
        first = await devnet.mine_block([deploy])
        [receipt] = await client.request("eth_getBlockReceipts", [quantity(first.number)])
        raw_logs = str(receipt["contractAddress"])
        tag_hash = topic_of("a tag")
        pair_hash = "0x" + keccak(encode(["(uint256,address)"], [(5, owner)])).hex()
        emits = [
            {"from": owner, "to": raw_logs, "gas": quantity(300_000), "data": emit_log_data(t, d)}
            for t, d in _raw_emits(tag_hash, pair_hash)
        ]
        second = await devnet.mine_block(emits)
        return Chain(
            url=url,
            head=second.number,
            pair=devnet.pair,
            raw_logs=raw_logs,
            raw_block=second.number,
            tag_hash=tag_hash,
            pair_hash=pair_hash,
        )


@pytest.fixture(scope="module")
def chain(anvil: Anvil) -> Chain:
    return asyncio.run(_build(anvil.url))


async def _register(store: BlockStore, name: str, lines: list[str], *addresses: str) -> None:
    document = entries_json([entry_from_signature(line) for line in lines])
    async with store.writer() as w:
        await w.put_abi(name, document, list(addresses))


@pytest.fixture
async def ingested(chain: Chain, db_url: str) -> AsyncIterator[tuple[BlockStore, IoRouter]]:
    """The chain ingested into this test's database, the devnet's ABIs registered,
    and a router with io.blockdb and io.logicalTypes over it."""
    url = parse_blockdb_url(db_url)
    await ingest(chain.url, url, IngestOptions(batch_size=50))
    store = await open_store(url)
    await _register(store, "pair", PAIR_ABI, chain.pair)
    await _register(store, "erc20", ERC20)
    await _register(store, "erc721", ERC721)
    await _register(store, "erc1155", ERC1155)
    await _register(store, "raw", [NOTE, TAGGED], chain.raw_logs)
    backend = BlockDbBackend(url, max_rows=10_000)
    await backend.start()
    yield store, open_router(None, blockdb=backend)
    await backend.close()
    await store.close()


async def _call(router: IoRouter, op: str, *args: Any, **kwargs: Any) -> Any:
    outcome = await router.execute("logicalTypes", op, list(args), kwargs, writes=False)
    assert isinstance(outcome, IoOk), outcome
    return outcome.decoded()


def _data_words(data: str) -> list[int]:
    digits = data[2:]
    return [int(digits[i : i + 64], 16) for i in range(0, len(digits), 64)]


async def test_the_devnets_logs_and_calls_decode_to_what_the_contracts_emitted(
    chain: Chain, ingested: tuple[BlockStore, IoRouter]
) -> None:
    store, router = ingested
    logs = await store.logs(0, chain.head)
    decoded = [await _call(router, "decode_log", log) for log in logs]
    by_name: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for log, event in zip(logs, decoded, strict=True):
        if event is not None:
            by_name.setdefault(event["name"], []).append((log, event))

    # The pair's Swaps: each one's values are its data words and topics, its sender
    # the transaction's sender, and a swap of ETH took the transaction's value in.
    swaps = by_name["Swap"]
    assert len(swaps) >= 3
    txs = {
        (t["block_number"], t["transaction_index"]): t
        for n in {log["block_number"] for log, _ in swaps}
        for t in await store.transactions(n)
    }
    for log, event in swaps:
        assert event["signature"] == "Swap(address,uint256,uint256,uint256,uint256,address)"
        args = event["args"]
        assert list(args) == ["sender", "amount0In", "amount1In", "amount0Out", "amount1Out", "to"]
        assert [args[k] for k in list(args)[1:5]] == _data_words(log["data"])
        tx = txs[(log["block_number"], log["transaction_index"])]
        assert args["sender"] == tx["from_address"]
        assert args["to"] == "0x" + log["topic2"][-40:]
        call = await _call(router, "decode_input", tx)
        if tx["input"].startswith(SWAP_ETH_FOR_TOKENS_SELECTOR):
            assert args["amount1In"] == int(tx["value"]) > 0
            assert call == {
                "function": "swapEthForTokens",
                "signature": "swapEthForTokens(address)",
                "args": {"to": args["to"]},
            }
        else:
            assert tx["input"].startswith(SWAP_TOKENS_FOR_ETH_SELECTOR)
            assert call["args"] == {"amountIn": args["amount0In"], "to": args["to"]}
    assert all(e["args"]["reserve0"] > 0 for _, e in by_name["Sync"])

    # ERC-20 and ERC-721 Transfers share topic0 and differ in their topics: each is
    # decoded by its own ABI, to what ingest derived into its tables.
    erc20 = await store.erc20_transfers(0, chain.head)
    assert [
        (log["log_index"], e["args"]) for log, e in by_name["Transfer"] if "value" in e["args"]
    ] == [
        (
            t["log_index"],
            {"from": t["from_address"], "to": t["to_address"], "value": int(t["value"])},
        )
        for t in erc20
    ]
    nfts = await store.rows("nft_transfers", 0, chain.head)
    erc721 = [(log, e) for log, e in by_name["Transfer"] if "tokenId" in e["args"]]
    assert [(log["address"], e["args"]) for log, e in erc721] == [
        (
            n["token"],
            {"from": n["from_address"], "to": n["to_address"], "tokenId": int(n["token_id"])},
        )
        for n in nfts
        if n["standard"] == "erc721"
    ]
    [(batch_log, batch)] = by_name["TransferBatch"]
    assert list(zip(batch["args"]["ids"], batch["args"]["values"], strict=True)) == [
        (int(n["token_id"]), int(n["amount"]))
        for n in nfts
        if n["log_index"] == batch_log["log_index"]
        and n["block_number"] == batch_log["block_number"]
    ]


async def test_anonymous_and_hashed_arguments_and_an_unknown_event(
    chain: Chain, ingested: tuple[BlockStore, IoRouter]
) -> None:
    store, router = ingested
    note, tagged, other = await store.logs(chain.raw_block, address=chain.raw_logs)
    registry = CollectorRegistry()
    IoMetrics(registry, router)
    before = registry.get_sample_value("blockx_io_logs_undecoded_total", {"chain": ""})
    assert before is not None

    assert await _call(router, "decode_log", note) == {
        "name": "Note",
        "signature": "Note(uint256,string)",
        "args": {"id": 7, "text": "seven"},
    }
    assert await _call(router, "decode_log", tagged) == {
        "name": "Tagged",
        "signature": "Tagged(string,(uint256,address),bytes32,(uint8,string)[],int16)",
        "args": {
            "tag": {"topic_hash": chain.tag_hash},
            "pair": {"topic_hash": chain.pair_hash},
            "key": "0x" + "6b" * 32,
            "items": [{"n": 1, "s": "one"}, {"n": 255, "s": "\u00e9t\u00e9"}],
            "delta": -3,
        },
    }
    assert await _call(router, "decode_log", other) is None
    # The anonymous event matches only at the address its ABI is registered for.
    elsewhere = dict(note, address="0x" + "99" * 20)
    assert await _call(router, "decode_log", elsewhere) is None
    assert registry.get_sample_value("blockx_io_logs_undecoded_total", {"chain": ""}) == before + 2
    # So too when the event is named, as the event unit names it; and an ABI of the
    # same anonymous event for any address matches nothing.
    named = await _call(router, "decode_logs", [note, elsewhere], abi="raw", event="Note")
    assert [e and e["args"] for e in named] == [{"id": 7, "text": "seven"}, None]
    await _register(store, "anywhere", [NOTE])
    assert await _call(router, "decode_logs", [note], abi="anywhere", event="Note") == [None]

    # The registry is read anew while the backend runs: an ABI for any address
    # decodes the unknown log once added, and nothing once removed.
    await _register(store, "other", ["event Other(uint256 indexed a, uint256 b)"])
    fresh = await _call(router, "abis")
    assert [a["name"] for a in fresh] == [
        "anywhere",
        "erc1155",
        "erc20",
        "erc721",
        "other",
        "pair",
        "raw",
    ]
    assert await _call(router, "decode_log", other) == {
        "name": "Other",
        "signature": "Other(uint256,uint256)",
        "args": {"a": 1, "b": 2},
    }
    async with store.writer() as w:
        assert await w.remove_abi("raw")
    await _call(router, "abis")
    assert await _call(router, "decode_log", note) is None


async def test_bad_requests_are_one_line_and_unknown_events_name_what_there_is(
    chain: Chain, ingested: tuple[BlockStore, IoRouter]
) -> None:
    _, router = ingested
    cases: list[tuple[str, list[Any], str]] = [
        ("decode", [["uint256[]"], "0x" + word(32) + word(2**255)], "does not decode"),
        ("decode", [["uint256"], "0x1"], "0x hex with whole bytes"),
        ("decode", [["string"], "0x" + word(32) + word(10**30)], "does not decode"),
        ("decode", [["uint7"], "0x"], "is no ABI type"),
        ("decode_log", [{"address": chain.pair, "topic0": "0x12"}], "32 bytes of 0x hex"),
        ("event", ["nope", "Swap"], "registered: erc1155, erc20, erc721, pair, raw"),
        ("event", ["pair", "Nope"], "its events: Swap, Sync"),
    ]
    for op, args, expected in cases:
        outcome = await router.execute("logicalTypes", op, args, {}, writes=False)
        assert isinstance(outcome, IoFailed), outcome
        assert outcome.kind == IoErrorKind.BAD_REQUEST, (op, args)
        assert expected in outcome.message, outcome.message
        assert "\n" not in outcome.message
    assert await _call(
        router,
        "decode",
        ["(uint256,bool)[]", "bytes"],
        "0x" + encode(["(uint256,bool)[]", "bytes"], [[(2**256 - 1, True)], b"\x01\x02"]).hex(),
    ) == [[[2**256 - 1, True]], "0x0102"]
    found = await _call(router, "event", "pair", "Swap")
    assert found["topic0"] == [topic_of("Swap(address,uint256,uint256,uint256,uint256,address)")]
    assert found["addresses"] == [chain.pair]


def test_abi_files_and_signatures_read_alike() -> None:
    document = [
        {
            "type": "event",
            "name": "Swap",
            "anonymous": False,
            "inputs": [
                {"name": "sender", "type": "address", "indexed": True},
                {"name": "amount0In", "type": "uint"},
            ],
        },
        {"type": "constructor", "inputs": []},
    ]
    from_file = entries_from_json(msgspec.json.encode({"abi": document}), "pair.json")
    assert from_file == [entry_from_signature("event Swap(address indexed sender, uint amount0In)")]


def _context(router: IoRouter) -> TaskContext:
    return TaskContext(
        task=TaskInput(task_id="t1", function_call_config=PluginConfig(type="x")),
        deadline_ms=0,
        code=CodeSnapshot(epoch=1, modules={}, functions={}, parse_errors={}),
        io=TaskIoScope(router, "t1"),
    )


async def test_the_event_unit_calls_once_per_decoded_event_and_refuses_unknown_names(
    chain: Chain, ingested: tuple[BlockStore, IoRouter]
) -> None:
    store, router = ingested
    swaps = await store.logs(
        0,
        chain.head,
        address=chain.pair,
        topic0=topic_of("Swap(address,uint256,uint256,uint256,uint256,address)"),
    )
    config = {
        "function": "f",
        "table": "logs",
        "unit": "event",
        "abi": "pair",
        "event": "Swap",
        "fromBlock": 0,
        "toBlock": chain.head,
    }
    built = await BlockBundleCallConfig().build(_context(router), config)
    expected = [await _call(router, "decode_log", log) for log in swaps]
    assert [c.args[0]["log"] for c in built.calls] == swaps
    assert [c.args[0]["event"] for c in built.calls] == expected
    assert [c.args[0]["block"]["block_number"] for c in built.calls] == [
        c.context.block_number if c.context is not None else None for c in built.calls
    ]
    # Streamed, chunk by chunk, the same calls.
    stream = await BlockBundleCallConfig().prepare_stream(_context(router), config)
    streamed = [call async for chunk in stream.chunks() for call in chunk]
    assert [c.args for c in streamed] == [c.args for c in built.calls]
    # One block, by BlockTableCallConfig.
    block = {k: v for k, v in config.items() if k not in ("fromBlock", "toBlock")}
    one = await BlockTableCallConfig().build(
        _context(router), {**block, "block": swaps[0]["block_number"]}
    )
    assert [c.args[0]["log"] for c in one.calls] == [
        s for s in swaps if s["block_number"] == swaps[0]["block_number"]
    ]

    for wrong, named in (
        ({"abi": "nope"}, "registered: erc1155, erc20, erc721, pair, raw"),
        ({"event": "Nope"}, "its events: Swap, Sync"),
        ({"table": "transactions"}, "reads the logs table, not"),
        ({"unit": "row"}, '`abi` and `event` go with `unit: "event"`'),
    ):
        with pytest.raises(PluginError) as failed:
            await BlockBundleCallConfig().build(_context(router), {**config, **wrong})
        assert not failed.value.retryable
        assert named in failed.value.message


async def test_an_older_database_gains_an_empty_registry(
    db_url: str,
) -> None:
    await make_database_at(db_url, ABIS_SINCE - 1)
    url = parse_blockdb_url(db_url)
    if db_url.startswith("sqlite"):
        # A reader of the older file sees an empty registry; it never migrates.
        reader = await open_store(url, read_only=True)
        assert (await reader.abis(), await reader.abis_revision()) == ([], (0, 0))
        await reader.close()
    store = await open_store(url)
    try:
        assert store.schema_version == SCHEMA_VERSION
        assert await store.abis() == []
        await _register(store, "erc20", ERC20)
        [record] = await store.abis()
        assert (record.name, record.addresses, record.revision) == ("erc20", (), 1)
        assert await store.abis_revision() == (1, 1)
    finally:
        await store.close()


async def test_a_users_table_named_abis_is_refused_in_one_line(db_url: str) -> None:
    await make_database_at(db_url, ABIS_SINCE - 1, extra_table="abis")
    with pytest.raises(SchemaRefused) as refused:
        await open_store(parse_blockdb_url(db_url))
    assert "\n" not in str(refused.value)
    assert f"already holds a table named 'abis', which BlockX's schema version {ABIS_SINCE}" in str(
        refused.value
    )


async def test_each_chain_counts_the_logs_it_decoded(
    chain: Chain, ingested: tuple[BlockStore, IoRouter], db_url: str
) -> None:
    """Served per chain, io.logicalTypes is counted under its chain's name."""
    store, _ = ingested
    note, _, other = await store.logs(chain.raw_block, address=chain.raw_logs)
    blockdb = BlockDbBackend(parse_blockdb_url(db_url), max_rows=10_000)
    await blockdb.start()
    try:
        router = IoRouter(
            chains=[
                ChainIo(ChainName("eth", 1), [LogicalTypesBackend(blockdb)]),
                ChainIo(ChainName("base", 8453), [LogicalTypesBackend(blockdb)]),
            ]
        )
        registry = CollectorRegistry()
        IoMetrics(registry, router)
        for log_row in (note, other, other):
            outcome = await router.execute(
                "logicalTypes", "decode_log", [log_row], {}, writes=False, chain="base"
            )
            assert isinstance(outcome, IoOk), outcome
    finally:
        await blockdb.close()
    counts = {
        (name, chain_name): registry.get_sample_value(
            f"blockx_io_logs_{name}_total", {"chain": chain_name}
        )
        for name in ("decoded", "undecoded")
        for chain_name in ("eth", "base")
    }
    assert counts == {
        ("decoded", "eth"): 0,
        ("undecoded", "eth"): 0,
        ("decoded", "base"): 1,
        ("undecoded", "base"): 2,
    }
