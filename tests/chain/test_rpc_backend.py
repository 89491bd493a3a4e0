"""``io.rpc`` through the IO door (IoRouter + TaskIoScope) against a real anvil:
shapes, reads at the block a hash names, writes refused before anything is sent,
unknown methods, NOT_FOUND, bad arguments, answers too large; and which reads a
cache may keep (``immutable``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from rpc_scripted import (
    ScriptedChain,
    ScriptedRpcServer,
    answer,
    chain_receipts,
    each,
    lying_head,
    tx_hash,
)
from support import free_port

from blockx_chain.contracts import TRANSFER_TOPIC, balance_of_data
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.devnet.generator import TOKEN_SUPPLY
from blockx_chain.rpc import JsonRpcClient
from blockx_core.failures import IoErrorKind
from blockx_core.io import FixedLimit
from blockx_server.io.backends.rpc import RpcBackend, RpcSettings
from blockx_server.io.config import open_router
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome
from blockx_server.io.finality import StaticFinality
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

FRESH = "0x000000000000000000000000000000000000b10c"
UNKNOWN_HASH = "0x" + "11" * 32


@dataclass(frozen=True)
class Chain:
    url: str
    token: str
    owner: str
    before: dict[str, Any]  # the block below the one that paid FRESH
    paid: dict[str, Any]  # the block that paid FRESH 12345 wei
    payment: str  # that transaction's hash
    head: int


_chains: dict[str, Chain] = {}


@pytest_asyncio.fixture
async def chain(anvil: Anvil) -> Chain:
    """Tokens, 3 blocks of transfers, a block paying FRESH, 2 more blocks (mined once
    per module)."""
    if anvil.url not in _chains:
        async with JsonRpcClient(anvil.url) as client:
            devnet = Devnet(client)
            await devnet.setup(tokens=1)
            below = (await devnet.mine(3))[-1]
            pay = {"from": devnet.accounts[19], "to": FRESH, "value": hex(12345), "gas": "0x5208"}
            paid = await devnet.mine_block([pay])
            await devnet.mine(2)
            before = await client.request("eth_getBlockByNumber", [hex(below.number), False])
            block = await client.request("eth_getBlockByNumber", [hex(paid.number), False])
            _chains[anvil.url] = Chain(
                anvil.url,
                devnet.tokens[0].address,
                devnet.accounts[0],
                before,
                block,
                block["transactions"][0],
                paid.number + 2,
            )
    return _chains[anvil.url]


@pytest_asyncio.fixture
async def backend(chain: Chain) -> AsyncIterator[RpcBackend]:
    rpc = RpcBackend(JsonRpcClient(chain.url))
    yield rpc
    await rpc.aclose()


@pytest.fixture
def scope(backend: RpcBackend) -> TaskIoScope:
    return TaskIoScope(IoRouter([backend]), "t-rpc")


def value(outcome: IoOutcome) -> Any:
    assert isinstance(outcome, IoOk), outcome
    return json.loads(outcome.value_json)


async def read(scope: TaskIoScope, op: str, *args: Any, **kwargs: Any) -> Any:
    return value(await scope.request("rpc", op, list(args), kwargs))


async def test_reads_have_the_shapes_functions_are_promised(
    scope: TaskIoScope, chain: Chain
) -> None:
    assert await read(scope, "chain_id") == 31337
    assert await read(scope, "block_number") == chain.head
    assert await read(scope, "balance", FRESH) == "12345"
    code = await read(scope, "code", chain.token)
    assert code.startswith("0x60")
    assert await read(scope, "code", FRESH) == "0x"
    # TestToken's storage: name (0), symbol (1), totalSupply (2).
    assert int(await read(scope, "storage", chain.token, 2), 16) == TOKEN_SUPPLY
    assert int(await read(scope, "storage", chain.token, "0x2", "latest"), 16) == TOKEN_SUPPLY
    owned = await read(scope, "call", chain.token, balance_of_data(chain.owner))
    assert 0 < int(owned, 16) < TOKEN_SUPPLY

    block = await read(scope, "block", int(chain.paid["number"], 16))
    assert block["hash"] == chain.paid["hash"]
    assert block["transactions"] == [chain.payment]
    full = await read(scope, "block", chain.paid["hash"], full=True)
    assert full["transactions"][0]["to"] == FRESH
    assert (await read(scope, "block", "latest"))["number"] == hex(chain.head)
    receipt = await read(scope, "receipt", chain.payment)
    assert receipt["status"] == "0x1"
    logs = await read(scope, "logs", 1, chain.head, address=chain.token, topics=[TRANSFER_TOPIC])
    assert logs
    assert {log["address"] for log in logs} == {chain.token}
    assert await read(scope, "request", "eth_getBalance", [FRESH, "latest"]) == hex(12345)
    assert await read(scope, "request", "eth_chainId") == "0x7a69"


async def test_state_is_read_at_exactly_the_block_a_hash_names(
    scope: TaskIoScope, chain: Chain
) -> None:
    before, paid = chain.before["hash"], chain.paid["hash"]
    assert await read(scope, "balance", FRESH, before) == "0"
    assert await read(scope, "balance", FRESH, paid) == "12345"
    assert await read(scope, "balance", FRESH, {"blockHash": before}) == "0"
    assert await read(scope, "balance", FRESH, {"blockHash": paid, "requireCanonical": True}) == (
        "12345"
    )
    assert await read(scope, "balance", FRESH, int(chain.before["number"], 16)) == "0"
    assert await read(scope, "balance", FRESH, {"blockNumber": chain.paid["number"]}) == "12345"
    assert await read(scope, "code", chain.token, before) == await read(scope, "code", chain.token)


WRITES = [
    ("eth_sendTransaction", [{"from": "0x" + "00" * 20}]),
    ("eth_sendRawTransaction", ["0x00"]),
    ("eth_sign", ["0x" + "00" * 20, "0x00"]),
    ("eth_signTypedData_v4", []),
    ("personal_sign", []),
    ("anvil_mine", [5]),
    ("anvil_setBalance", [FRESH, "0x1"]),
    ("evm_mine", []),
    ("evm_revert", ["0x1"]),
    ("hardhat_mine", []),
    ("miner_start", []),
    ("admin_addPeer", []),
    ("debug_setHead", ["0x1"]),
]


@pytest.mark.parametrize(("method", "params"), WRITES)
async def test_a_state_changing_method_is_refused_before_anything_is_sent(
    scope: TaskIoScope, backend: RpcBackend, chain: Chain, method: str, params: list[Any]
) -> None:
    outcome = await scope.request("rpc", "request", [method, params])
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind is IoErrorKind.WRITE_FORBIDDEN
    assert not outcome.retryable
    assert method in outcome.message
    assert backend.client.stats.http_requests == 0
    # Not even a Writer Plugin's scope may write through io.rpc.
    writer = await scope.writer().request("rpc", "request", [method, params])
    assert isinstance(writer, IoFailed), writer
    assert writer.kind == IoErrorKind.WRITE_FORBIDDEN
    assert await read(scope, "block_number") == chain.head


FAILURES = [
    # (op, args, kwargs, kind, words)
    ("request", ["eth_foo", []], {}, IoErrorKind.UNKNOWN_OP, "does not allow 'eth_foo'"),
    ("request", ["net_version", []], {}, IoErrorKind.UNKNOWN_OP, "eth_getLogs"),
    ("request", ["eth_getBlockByNumber", ["0x2710", False]], {}, IoErrorKind.NOT_FOUND, "know"),
    ("request", ["eth_getBalance", "x"], {}, IoErrorKind.BAD_REQUEST, "params: list"),
    ("block", [10_000], {}, IoErrorKind.NOT_FOUND, "eth_getBlockByNumber"),
    ("block", [UNKNOWN_HASH], {}, IoErrorKind.NOT_FOUND, "eth_getBlockByHash"),
    ("receipt", [UNKNOWN_HASH], {}, IoErrorKind.NOT_FOUND, "eth_getTransactionReceipt"),
    ("balance", [FRESH, UNKNOWN_HASH], {}, IoErrorKind.NOT_FOUND, "not found"),
    ("logs", [1, 10_000], {}, IoErrorKind.NOT_FOUND, "0x2710"),
    ("balance", ["0xnothex"], {}, IoErrorKind.BAD_REQUEST, "an address is 0x"),
    ("balance", [FRESH, "yesterday"], {}, IoErrorKind.BAD_REQUEST, "a block is a number"),
    ("balance", [FRESH, -1], {}, IoErrorKind.BAD_REQUEST, "not negative"),
    ("block", [True], {}, IoErrorKind.BAD_REQUEST, "not a bool"),
    ("block", [1], {"full": "yes"}, IoErrorKind.BAD_REQUEST, "full is a bool"),
    ("storage", [FRESH, "slot"], {}, IoErrorKind.BAD_REQUEST, "storage slot"),
    ("call", [FRESH, "0x1"], {}, IoErrorKind.BAD_REQUEST, "whole bytes"),
    ("balance", [], {}, IoErrorKind.BAD_REQUEST, "balance(address"),
    ("chain_id", [1], {}, IoErrorKind.BAD_REQUEST, "chain_id()"),
    ("transfer", [], {}, IoErrorKind.UNKNOWN_OP, "no operation 'transfer'"),
]


@pytest.mark.parametrize(("op", "args", "kwargs", "kind", "words"), FAILURES)
async def test_failures(
    scope: TaskIoScope,
    op: str,
    args: list[Any],
    kwargs: dict[str, Any],
    kind: IoErrorKind,
    words: str,
) -> None:
    outcome = await scope.request("rpc", op, args, kwargs)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == kind, outcome.message
    assert words in outcome.message
    assert not outcome.retryable


async def test_an_answer_too_large_is_bad_request(chain: Chain) -> None:
    backend = RpcBackend(JsonRpcClient(chain.url, max_response_bytes=2048))
    try:
        outcome = await IoRouter([backend]).execute("rpc", "code", [chain.token], {}, writes=False)
    finally:
        await backend.aclose()
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.BAD_REQUEST
    assert "RPC_MAX_RESPONSE_BYTES" in outcome.message


async def test_an_unreachable_node_is_retryable_unavailable() -> None:
    router = open_router(None, rpc=RpcSettings(url=f"http://127.0.0.1:{free_port()}"))
    outcome = await router.execute("rpc", "block_number", [], {}, writes=False)
    assert isinstance(outcome, IoFailed), outcome
    assert outcome.kind == IoErrorKind.UNAVAILABLE
    assert outcome.retryable


def test_without_chain_rpc_url_there_is_no_rpc_backend() -> None:
    assert open_router(None).names() == ["memory"]
    assert open_router(None, rpc=RpcSettings(url="http://127.0.0.1:8545")).names() == [
        "memory",
        "rpc",
    ]


H = "0x" + "ab" * 32
IMMUTABLE = [
    # (op, args, kwargs, immutable with finalized = 100)
    ("chain_id", [], {}, True),
    ("block_number", [], {}, False),
    ("balance", [FRESH], {}, False),
    ("balance", [FRESH, "latest"], {}, False),
    ("balance", [FRESH, "pending"], {}, False),
    ("balance", [FRESH, "finalized"], {}, False),
    ("balance", [FRESH, 100], {}, True),
    ("balance", [FRESH], {"block": 101}, False),
    ("balance", [FRESH, "0x64"], {}, True),
    ("balance", [FRESH, H], {}, True),
    ("balance", [FRESH, {"blockHash": H}], {}, True),
    ("balance", [FRESH, {"blockHash": H, "requireCanonical": True}], {}, False),
    ("balance", [FRESH, {"blockNumber": "0x10"}], {}, True),
    ("code", [FRESH, 5], {}, True),
    ("call", [FRESH, "0x"], {"block": 5}, True),
    ("call", [FRESH, "0x"], {}, False),
    ("storage", [FRESH, 0, 100], {}, True),
    ("storage", [FRESH, 0, 200], {}, False),
    ("block", [50], {}, True),
    ("block", [50], {"full": True}, True),
    ("block", [150], {}, False),
    ("block", [H], {}, True),
    ("block", ["latest"], {}, False),
    ("receipt", [H], {}, False),
    ("logs", [10, 100], {}, True),
    ("logs", [10, 101], {}, False),
    ("logs", ["earliest", 50], {}, False),
    ("logs", [10, "latest"], {}, False),
    ("request", ["eth_chainId"], {}, True),
    ("request", ["eth_blockNumber"], {}, False),
    ("request", ["eth_getBlockByNumber", ["0x10", False]], {}, True),
    ("request", ["eth_getBlockByNumber", ["latest", False]], {}, False),
    ("request", ["eth_getBlockByHash", [H, False]], {}, True),
    ("request", ["eth_getBalance", [FRESH, "0x10"]], {}, True),
    ("request", ["eth_getBalance", [FRESH]], {}, False),
    ("request", ["eth_getStorageAt", [FRESH, "0x0", "0x10"]], {}, True),
    ("request", ["eth_getLogs", [{"fromBlock": "0x1", "toBlock": "0x10"}]], {}, True),
    ("request", ["eth_getLogs", [{"fromBlock": "0x1"}]], {}, False),
    ("request", ["eth_getLogs", [{"blockHash": H}]], {}, True),
    ("request", ["eth_getTransactionReceipt", [H]], {}, False),
    ("request", ["eth_gasPrice"], {}, False),
    ("block", ["nonsense"], {}, False),
    ("balance", [], {}, False),
]


@pytest.mark.parametrize(("op", "args", "kwargs", "expected"), IMMUTABLE)
def test_which_reads_can_never_change(
    op: str, args: list[Any], kwargs: dict[str, Any], expected: bool
) -> None:
    backend = RpcBackend(JsonRpcClient("http://127.0.0.1:1"))
    assert backend.immutable(op, args, kwargs, finalized=100) is expected


# -- a node that answers wrongly ------------------------------------------------------


async def test_an_answer_with_a_malformed_id_fails_the_read_and_frees_its_admission() -> None:
    """One admission slot: a read left without an answer would hold it for good, and
    every later read would wait IO_QUEUE_TIMEOUT_MS and fail."""
    chain = ScriptedChain(head=16)
    replies = 0

    async def handler(request: Any) -> tuple[int, bytes]:
        nonlocal replies
        replies += 1
        if replies == 1:
            return 200, each(request, lambda r: {**answer(r, "0x10"), "id": [r["id"]]})
        return await chain(request)

    async with ScriptedRpcServer(handler) as node:
        backend = RpcBackend(JsonRpcClient(node.url))
        router = IoRouter([backend], limits=lambda name: FixedLimit(1))
        try:
            # A guard against the hang this test is about, not a measure of time.
            first = await asyncio.wait_for(
                TaskIoScope(router, "t1").request("rpc", "block_number", []), 30
            )
            second = await TaskIoScope(router, "t2").request("rpc", "block_number", [])
        finally:
            await backend.aclose()
    assert isinstance(first, IoFailed), first
    assert first.kind == IoErrorKind.UNAVAILABLE, first.message
    assert first.retryable
    assert value(second) == 16
    (gate,) = router.gates()
    assert gate.in_flight == 0


def _shifted(request: dict[str, Any], result: Any) -> Any:
    """Block 111 (and its receipts) for block 11."""
    if request["params"][:1] == ["0xb"]:
        return ScriptedChain(head=200).answer(request["method"], ["0x6f", *request["params"][1:]])
    return result


def _other_receipt(request: dict[str, Any], result: Any) -> Any:
    if request["method"] == "eth_getTransactionReceipt":
        return chain_receipts(12)[0]
    return result


def _far_log(request: dict[str, Any], result: Any) -> Any:
    if request["method"] == "eth_getLogs":
        return [{**log, "blockNumber": "0x1f4"} for log in result]
    return result


LIES = [
    # (the lie, op, args, words of the error)
    (_shifted, "block", [11], "the node answered block 111, not block 11"),
    (_shifted, "block", [11], "eth_getBlockByNumber(0xb, false)"),
    (_shifted, "request", ["eth_getBlockByNumber", ["0xb", True]], "not block 11"),
    (_shifted, "request", ["eth_getBlockReceipts", ["0xb"]], "a receipt of block 111, not of"),
    (_other_receipt, "receipt", [tx_hash(11)], f"not {tx_hash(11)}"),
    (_far_log, "logs", [10, 12], "a log of block 500, outside blocks 10..12"),
    (lying_head("0xzz"), "block_number", [], "eth_blockNumber: not a quantity"),
    (lying_head("0x" + "f" * 4000), "block_number", [], "(4002 characters)"),
]


@pytest.mark.parametrize(("lie", "op", "args", "words"), LIES)
async def test_an_answer_that_is_not_what_was_asked_for_is_refused_and_not_cached(
    lie: Callable[[dict[str, Any], Any], Any], op: str, args: list[Any], words: str
) -> None:
    chain = ScriptedChain(head=200, lie=lie)
    async with ScriptedRpcServer(chain) as node:
        backend = RpcBackend(JsonRpcClient(node.url))
        # Blocks up to 150 are final: an answer about them would be cached.
        router = IoRouter([backend], finality=StaticFinality(finalized=150, epoch=0))
        scope = TaskIoScope(router, "t1")
        try:
            refused = await scope.request("rpc", op, args)
            chain.lie = None
            honest = await scope.request("rpc", op, args)
        finally:
            await backend.aclose()
    assert isinstance(refused, IoFailed), refused
    assert refused.kind == IoErrorKind.BAD_VALUE, refused.message
    assert not refused.retryable
    assert words in refused.message
    assert isinstance(honest, IoOk), honest
    assert not honest.cached
