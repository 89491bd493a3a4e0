"""Selective ingest (``--logs``): against a scripted node that refuses log queries
the way real providers do (too many results, a response too large with a suggested
range, a block range too wide with and without its limit, HTTP 413, an answer over
the client's size limit, HTTP 429 with Retry-After), each time compared with a full
ingest of the same blocks; against anvil on SQLite and PostgreSQL (the same rows as
a full ingest, a reorg inside the range rolled back, the filter recorded, what the
database does not hold refused); and answers that are not what was asked."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rpc_scripted import TOKEN, ScriptedChain, ScriptedRpcServer, each, error
from support import wait_until
from typer.testing import CliRunner

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.ingest import (
    BadNodeAnswer,
    FilterRefused,
    IngestError,
    IngestOptions,
    IngestSummary,
    ingest,
)
from blockx_chain.ingest.log_fetch import LogQuery
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.schema import TRANSFER_TOPIC, LogFilterRecord
from blockx_chain.store import NotHeld, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.app import app

HEAD = 200
SCRIPTED_QUERY = LogQuery(addresses=(TOKEN,), topic0s=(TRANSFER_TOPIC,))

Rows = dict[str, list[dict[str, Any]]]


async def stored(url: str, head: int) -> Rows:
    store = await open_store(parse_blockdb_url(url), read_only=True)
    try:
        return {
            "blocks": await store.blocks(0, head),
            "logs": await store.logs(0, head),
            "erc20_transfers": await store.erc20_transfers(0, head),
        }
    finally:
        await store.close()


def assert_same_as_full(selective: Rows, full: Rows, query: LogQuery) -> None:
    """The selective database's logs and transfers are the full one's that match its
    filter, none missed or doubled; each block row it holds is the full one's."""

    def matches(log: dict[str, Any]) -> bool:
        return (not query.addresses or log["address"] in query.addresses) and (
            not query.topic0s or log["topic0"] in query.topic0s
        )

    expected_logs = [log for log in full["logs"] if matches(log)]
    assert expected_logs, "the chain holds matching logs"
    assert selective["logs"] == expected_logs
    kept = {(log["block_number"], log["log_index"]) for log in expected_logs}
    assert selective["erc20_transfers"] == [
        t for t in full["erc20_transfers"] if (t["block_number"], t["log_index"]) in kept
    ]
    by_number = {b["block_number"]: b for b in full["blocks"]}
    assert all(by_number[b["block_number"]] == b for b in selective["blocks"])
    held = {b["block_number"] for b in selective["blocks"]}
    assert {log["block_number"] for log in expected_logs} <= held


_reference: dict[int, Rows] = {}


async def full_reference(tmp_path: Path, head: int = HEAD) -> Rows:
    """A full ingest of the scripted chain's blocks 0..head (made once)."""
    if head not in _reference:
        url = f"sqlite:///{tmp_path}/full.db"
        async with ScriptedRpcServer(ScriptedChain(head)) as node:
            await ingest(node.url, parse_blockdb_url(url), IngestOptions(batch_size=100))
        _reference[head] = await stored(url, head)
    return _reference[head]


# -- a provider's limits on eth_getLogs ---------------------------------------------

Verdict = tuple[int, str] | None  # (JSON-RPC code, message) of a refusal


class Provider:
    """A ScriptedChain behind a provider: ``refuse(first, last)`` decides each
    eth_getLogs (a JSON-RPC error, or None to answer it); ``http(first, last)`` an HTTP
    status and headers for the whole request instead. Records every log query asked
    (``asked``: first, last, refused, monotonic time)."""

    def __init__(
        self,
        chain: ScriptedChain,
        refuse: Callable[[int, int], Verdict] = lambda first, last: None,
        http: Callable[[int, int], tuple[int, dict[str, str]] | None] = lambda first, last: None,
    ) -> None:
        self.chain = chain
        self.refuse = refuse
        self.http = http
        self.asked: list[tuple[int, int, bool, float]] = []

    async def __call__(self, request: Any) -> tuple[int, bytes] | tuple[int, bytes, dict[str, str]]:
        for r in request if isinstance(request, list) else [request]:
            if r["method"] == "eth_getLogs":
                span = _span(r)
                answered = self.http(*span)
                if answered is not None:
                    self.asked.append((*span, True, time.monotonic()))
                    status, headers = answered
                    return status, b"refused", headers
        return 200, each(request, self._one)

    def _one(self, request: dict[str, Any]) -> dict[str, Any]:
        if request["method"] == "eth_getLogs":
            verdict = self.refuse(*_span(request))
            self.asked.append((*_span(request), verdict is not None, time.monotonic()))
            if verdict is not None:
                return error(request, *verdict)
        return {
            "jsonrpc": "2.0",
            "id": request["id"],
            "result": self.chain.answer(request["method"], request["params"]),
        }

    def answered(self) -> list[tuple[int, int]]:
        return [(first, last) for first, last, refused, _ in self.asked if not refused]

    def refused(self) -> list[tuple[int, int]]:
        return [(first, last) for first, last, refused, _ in self.asked if refused]


def _span(request: dict[str, Any]) -> tuple[int, int]:
    query = request["params"][0]
    return int(query["fromBlock"], 16), int(query["toBlock"], 16)


def wider_than(blocks: int, verdict: tuple[int, str]) -> Callable[[int, int], Verdict]:
    return lambda first, last: verdict if last - first + 1 > blocks else None


def alchemy(first: int, last: int) -> Verdict:
    """More than 40 logs (one a block here): refused, suggesting 30 blocks."""
    if last - first + 1 <= 40:
        return None
    return (
        -32602,
        "Log response size exceeded. You can make eth_getLogs requests with up to a 2K "
        "block range and no limit on the response size, or you can request any block "
        "range with a cap of 10K logs in the response. Based on your parameters, this "
        f"block range should work: [{hex(first)}, {hex(first + 29)}]",
    )


async def selective(node_url: str, db_url: str, **options: Any) -> IngestSummary:
    options.setdefault("logs", SCRIPTED_QUERY)
    return await ingest(node_url, parse_blockdb_url(db_url), IngestOptions(**options))


def regrew(answered: list[tuple[int, int]]) -> bool:
    """Some answered query is wider than an earlier, narrower answered one."""
    widths = [last - first + 1 for first, last in answered[:-1]]  # the last is cut short
    return any(later > min(widths[:i]) for i, later in enumerate(widths) if i)


PROVIDERS = {
    # Infura/Alchemy: a count of results (40 here, as one log a block).
    "too many results": dict(
        refuse=wider_than(40, (-32005, "query returned more than 10000 results"))
    ),
    # A fixed block range, named.
    "exceed maximum block range": dict(
        refuse=wider_than(50, (-32000, "exceed maximum block range: 50"))
    ),
    # A fixed block range, not named.
    "block range is too wide": dict(refuse=wider_than(45, (-32600, "block range is too wide"))),
}


@pytest.mark.parametrize("provider", list(PROVIDERS))
async def test_ranges_split_and_regrow_under_each_limit(provider: str, tmp_path: Path) -> None:
    node = Provider(ScriptedChain(HEAD), **PROVIDERS[provider])  # type: ignore[arg-type]
    url = f"sqlite:///{tmp_path}/logs.db"
    async with ScriptedRpcServer(node) as server:
        summary = await selective(server.url, url, log_range=1000)
    assert node.refused(), "the provider refused some ranges"
    assert summary.log_splits == len(node.refused())
    # Every block asked once, in order, whatever was refused.
    covered = [n for first, last in node.answered() for n in range(first, last + 1)]
    assert covered == list(range(HEAD + 1))
    assert_same_as_full(await stored(url, HEAD), await full_reference(tmp_path), SCRIPTED_QUERY)
    if provider == "too many results":
        # The results' cap is learnt: the queries aim below it, and few are refused.
        assert len(node.refused()) <= 6
    elif provider == "exceed maximum block range":
        # A limit the message names is believed at once.
        assert len(node.refused()) == 1
        assert {last - first + 1 for first, last in node.answered()[:-1]} == {50}
    else:
        # A limit it does not name is searched for, and once found not passed again.
        assert regrew(node.answered())
        first_ok = next(i for i, a in enumerate(node.asked) if not a[2])
        assert all(last - first + 1 <= 45 for first, last, _, _ in node.asked[first_ok + 8 :])


async def test_the_suggested_range_is_honoured(tmp_path: Path) -> None:
    node = Provider(ScriptedChain(HEAD), refuse=alchemy)
    url = f"sqlite:///{tmp_path}/logs.db"
    async with ScriptedRpcServer(node) as server:
        await selective(server.url, url, in_flight=1)
    refused = [i for i, a in enumerate(node.asked) if a[2]]
    assert refused
    for i in refused:
        first = node.asked[i][0]
        assert node.asked[i + 1][:2] == (first, first + 29)  # exactly what was suggested
    assert_same_as_full(await stored(url, HEAD), await full_reference(tmp_path), SCRIPTED_QUERY)


async def test_http_413_and_an_answer_over_the_size_limit_split_the_range(
    tmp_path: Path,
) -> None:
    # HTTP 413 for a query of more than 60 blocks.
    node = Provider(
        ScriptedChain(HEAD), http=lambda first, last: (413, {}) if last - first >= 60 else None
    )
    url = f"sqlite:///{tmp_path}/413.db"
    async with ScriptedRpcServer(node) as server:
        await selective(server.url, url, in_flight=1)
    assert node.refused()
    assert all(last - first < 60 for first, last in node.answered())
    assert_same_as_full(await stored(url, HEAD), await full_reference(tmp_path), SCRIPTED_QUERY)
    # An answer over RPC_MAX_RESPONSE_BYTES (one log is about 600 bytes of JSON).
    node = Provider(ScriptedChain(HEAD))
    url = f"sqlite:///{tmp_path}/bytes.db"
    async with ScriptedRpcServer(node) as server:
        summary = await selective(server.url, url, max_response_bytes=16 * 1024, batch_size=5)
    assert summary.log_splits > 0
    assert summary.widest_log_range < 40  # 16 KiB holds fewer logs than that
    assert_same_as_full(await stored(url, HEAD), await full_reference(tmp_path), SCRIPTED_QUERY)


async def test_http_429_waits_retry_after(tmp_path: Path) -> None:
    calls = 0

    def rate_limited(first: int, last: int) -> tuple[int, dict[str, str]] | None:
        nonlocal calls
        calls += 1
        return (429, {"retry-after": "0.2"}) if calls % 3 == 1 else None

    node = Provider(ScriptedChain(HEAD), http=rate_limited)
    url = f"sqlite:///{tmp_path}/logs.db"
    async with ScriptedRpcServer(node) as server:
        summary = await selective(server.url, url, in_flight=1, log_range=20, max_log_range=40)
    waits = [
        after[3] - before[3]
        for before, after in zip(node.asked, node.asked[1:], strict=False)
        if before[2]
    ]
    assert len(waits) >= 2
    assert min(waits) >= 0.2  # never asked again before Retry-After
    assert summary.rate_limited_s > 0
    assert summary.log_splits == 0  # a rate limit is no reason to narrow
    assert_same_as_full(await stored(url, HEAD), await full_reference(tmp_path), SCRIPTED_QUERY)


async def test_the_same_rows_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    node = Provider(ScriptedChain(HEAD), refuse=PROVIDERS["too many results"]["refuse"])
    async with ScriptedRpcServer(node) as server:
        first = await selective(server.url, postgres_url, from_block=50, to_block=100)
        with pytest.raises(IngestError, match="--from 10 is below block 50, where the data"):
            await selective(server.url, postgres_url, from_block=10)
        second = await selective(server.url, postgres_url)
    assert (first.scanned, second.scanned) == (51, HEAD - 100)
    full = await full_reference(tmp_path)
    from_50 = {name: [r for r in rows if r["block_number"] >= 50] for name, rows in full.items()}
    assert_same_as_full(await stored(postgres_url, HEAD), from_50, SCRIPTED_QUERY)


# -- answers that are not what was asked ---------------------------------------------


def lying_logs(change: Callable[[dict[str, Any]], None]) -> Callable[[Any], Any]:
    chain = ScriptedChain(HEAD)

    async def handler(request: Any) -> tuple[int, bytes]:
        def one(r: dict[str, Any]) -> dict[str, Any]:
            result = chain.answer(r["method"], r["params"])
            if r["method"] == "eth_getLogs" and result:
                result = [dict(log) for log in result]
                change(result[-1])
            return {"jsonrpc": "2.0", "id": r["id"], "result": result}

        return 200, each(request, one)

    return handler


LIES = [
    (
        lambda log: log.update(blockNumber=hex(int(log["blockNumber"], 16) + 5000)),
        r"blocks 0\.\.200: eth_getLogs\(.*\): \[200\]: a log of block 5200, "
        r"outside blocks 0\.\.200",
    ),
    (
        lambda log: log.update(address="0x" + "99" * 20),
        r"blocks 0\.\.200: eth_getLogs\(.*\): \[200\]: a log of address '0x9999.*', not one "
        r"asked for",
    ),
    (
        lambda log: log.update(transactionHash="0x" + "ab" * 32),
        r"blocks 0\.\.200: eth_getLogs: log 0 of block 200: transaction 0xabab.* is not the "
        r"block's "
        r"transaction 0 \(1 transactions\)",
    ),
]


@pytest.mark.parametrize(("change", "message"), LIES)
async def test_a_log_that_was_not_asked_for_is_refused_and_nothing_is_written(
    change: Callable[[dict[str, Any]], None], message: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/logs.db"
    async with ScriptedRpcServer(lying_logs(change)) as server:
        with pytest.raises(BadNodeAnswer) as refused:
            await selective(server.url, url)
    assert re.fullmatch(message, str(refused.value)), str(refused.value)
    assert not (tmp_path / "logs.db").exists()


# -- against anvil ------------------------------------------------------------------


class Chain:
    def __init__(self, node: Anvil, net: Devnet) -> None:
        self.node = node
        self.net = net
        self.query = LogQuery(addresses=(net.tokens[0].address.lower(),), topic0s=(TRANSFER_TOPIC,))


@pytest.fixture(scope="module")
def devnet_chain() -> Iterator[Chain]:
    """One anvil for the module's tests that do not reorg: 3 tokens, 120 blocks."""

    async def mine(url: str) -> Devnet:
        async with JsonRpcClient(url) as client:
            net = Devnet(client)
            await net.setup(tokens=3)
            await net.mine(120, token_transfers=2, eth_transfers=1)
            return net

    with Anvil() as node:
        yield Chain(node, asyncio.run(mine(node.url)))


@pytest.fixture
def full_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/full.db"


async def test_anvil_selective_equals_full_and_refuses_what_it_lacks(
    devnet_chain: Chain, db_url: str, full_url: str
) -> None:
    node, query = devnet_chain.node, devnet_chain.query
    head = 122
    await ingest(node.url, parse_blockdb_url(full_url), IngestOptions(to_block=head))
    summary = await selective(node.url, db_url, logs=query, to_block=head, log_range=16)
    rows = await stored(db_url, head)
    assert_same_as_full(rows, await stored(full_url, head), query)
    assert summary.scanned == head + 1
    assert summary.log_requests > 1
    assert summary.blocks == len(rows["blocks"]) < head + 1  # not every block
    # The blocks near the head are all held, for the next run's reorg checks.
    near = {b["block_number"] for b in rows["blocks"]}
    assert set(range(head - 63, head + 1)) <= near
    record = LogFilterRecord(addresses=query.addresses, topic0s=query.topic0s, from_block=0)
    assert summary.log_filter == record
    store = await open_store(parse_blockdb_url(db_url), read_only=True)
    try:
        assert await store.log_filter() == record
        with pytest.raises(NotHeld, match=r"it has no transactions; read them from a database"):
            await store.transactions(5)
        with pytest.raises(NotHeld, match="it has no transactions"):
            await store.rows("transactions", 0, 10)
        other = devnet_chain.net.tokens[1].address
        with pytest.raises(NotHeld, match=f"logs of {other.lower()} are not in it"):
            await store.logs(0, 10, address=other)
        assert await store.rows("logs", 0, head) == rows["logs"]
    finally:
        await store.close()
    # Nothing of another kind goes in, and the database is left as it was.
    with pytest.raises(FilterRefused, match=r"a full ingest would leave its earlier blocks"):
        await ingest(node.url, parse_blockdb_url(db_url))
    with pytest.raises(FilterRefused, match=r"a database keeps the filter it was made with"):
        await selective(node.url, db_url, logs=LogQuery(addresses=query.addresses))
    with pytest.raises(FilterRefused, match=r"the block database holds whole blocks"):
        await selective(node.url, full_url, logs=query)
    assert await stored(db_url, head) == rows


async def test_anvil_a_reorg_inside_the_selective_range_is_rolled_back(
    db_url: str, tmp_path: Path
) -> None:
    await _reorg_rolled_back(db_url, tmp_path, follow=False)


async def test_anvil_following_rolls_a_reorg_back(tmp_path: Path) -> None:
    await _reorg_rolled_back(f"sqlite:///{tmp_path}/logs.db", tmp_path, follow=True)


async def _reorg_rolled_back(db_url: str, tmp_path: Path, *, follow: bool) -> None:
    """A chain of 14 blocks ingested selectively, then a reorg of depth 5 with 7 new
    blocks: the rows of the abandoned blocks are gone and the new ones are a full
    ingest's."""
    with Anvil() as node:
        async with JsonRpcClient(node.url) as client:
            net = Devnet(client)
            await net.setup(tokens=2, reorgable=True)
            await net.mine(12, token_transfers=3, eth_transfers=0, reorgable=True)
            query = LogQuery(addresses=(net.tokens[0].address.lower(),), topic0s=(TRANSFER_TOPIC,))
            if follow:
                stop = asyncio.Event()
                following = asyncio.create_task(
                    ingest(
                        node.url,
                        parse_blockdb_url(db_url),
                        IngestOptions(logs=query, follow=True, poll_interval_s=0.05),
                        stop=stop,
                    )
                )
                await wait_until(lambda: _head_is(db_url, 14), "the first blocks")
                reorg = await net.reorg(5, new_blocks=7, token_transfers=3, eth_transfers=0)
                await wait_until(lambda: _head_is(db_url, 16), "the new branch")
                stop.set()
                summary = await asyncio.wait_for(following, 30)
            else:
                await selective(node.url, db_url, logs=query)
                reorg = await net.reorg(5, new_blocks=7, token_transfers=3, eth_transfers=0)
                summary = await selective(node.url, db_url, logs=query)
        full_url = f"sqlite:///{tmp_path}/full.db"
        await ingest(node.url, parse_blockdb_url(full_url))
    assert summary.reorgs == 1
    rows = await stored(db_url, 16)
    assert_same_as_full(rows, await stored(full_url, 16), query)
    old = set(reorg.old_hashes.values())
    for table, table_rows in rows.items():
        assert not [r for r in table_rows if r["block_hash"] in old], table
    store = await open_store(parse_blockdb_url(db_url), read_only=True)
    try:
        [recorded] = await store.reorgs()
        assert recorded["fork_block_number"] == reorg.fork_block_number
    finally:
        await store.close()


async def _head_is(db_url: str, number: int) -> bool:
    try:
        store = await open_store(parse_blockdb_url(db_url), read_only=True)
    except Exception:
        return False
    try:
        head = await store.head()
        return head is not None and head["number"] == number
    finally:
        await store.close()


# -- the command ----------------------------------------------------------------------


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_the_command_prints_what_it_scanned_and_refuses_bad_flags(
    runner: CliRunner, tmp_path: Path
) -> None:
    from rpc_scripted import served_in_thread

    db = f"sqlite:///{tmp_path}/logs.db"
    with served_in_thread(ScriptedChain(HEAD)) as url:
        base = ["chain", "ingest", "--rpc", url, "--db", db]
        result = runner.invoke(
            app, [*base, "--logs", "--address", TOKEN.upper().replace("0X", "0x"), "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        assert data["log_filter"] == {"addresses": [TOKEN], "topic0s": [], "from_block": 0}
        assert (data["scanned"], data["logs"], data["erc20_transfers"]) == (201, 201, 201)
        result = runner.invoke(app, [*base, "--logs", "--address", TOKEN])
        assert result.exit_code == 0, result.output
        assert re.fullmatch(
            rf"scanned blocks 201\.\.200 for the logs of {TOKEN} with topic0 any: 0 logs, "
            r"0 ERC-20 transfers, 0 block headers, 0 reorgs in \d+\.\d s "
            r"\(no eth_getLogs\)\n",
            result.output,
        ), result.output
        result = runner.invoke(app, [*base, "--logs", "--topic0", "0x12"])
        assert result.exit_code == 2
        assert "--topic0 must be 32 bytes of 0x hex, got '0x12'" in result.output
        result = runner.invoke(app, [*base, "--address", TOKEN])
        assert result.exit_code == 2
        assert "--address and --topic0 select logs: pass --logs with them" in result.output
        result = runner.invoke(app, [*base])
        assert result.exit_code == 1
        assert "a full ingest would leave its earlier blocks without transactions" in (
            result.output
        )
    result = runner.invoke(app, ["chain", "status", "--db", db])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == [
        "chain 31337, head 200, finalized 136, epoch 0",
        f"holds only logs (blockx chain ingest --logs) of {TOKEN} with topic0 any, from "
        "block 0, with their blocks' headers: no transactions",
    ]
    result = runner.invoke(app, ["chain", "status", "--db", db, "--json"])
    status = json.loads(result.output)
    assert (status["holds"], status["head"], status["log_filter"]["addresses"]) == (
        "logs",
        200,
        [TOKEN],
    )
