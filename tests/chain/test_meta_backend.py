"""``io.meta`` of one chain through the IO door, against a real anvil and a real
SQLite block database: the chain's description, and ``token`` of the devnet's
ERC-20, of its ERC-721 (no ``decimals``, no ``totalSupply``), of an address without
code; a pinned finalized answer is cached. The decoders refuse malformed answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest_asyncio

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.devnet.generator import TOKEN_SUPPLY
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.ingest.log_fetch import LogQuery
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.url import parse_blockdb_url
from blockx_server.io.backends.meta import MAX_TEXT_BYTES, decode_text, decode_uint
from blockx_server.io.backends.rpc import RpcSettings
from blockx_server.io.chain_config import ChainSettings, close_chains, open_chains
from blockx_server.io.config import BlockDbSettings
from blockx_server.io.errors import IoFailed, IoOk
from blockx_server.io.finality import ChainFinality
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope

NO_CODE = "0x000000000000000000000000000000000000dead"


class Devchain(msgspec.Struct, frozen=True):
    token: str
    nft: str
    deployed: int  # the block after the tokens' deployment
    head: int


_made: dict[str, Devchain] = {}


@pytest_asyncio.fixture
async def router(anvil: Anvil, tmp_path: Path) -> AsyncIterator[tuple[IoRouter, Devchain]]:
    """The devnet (mined once per module) ingested into this test's database, served
    as the chain ``eth`` (its chain id read from the database: the shorthand)."""
    if anvil.url not in _made:
        async with JsonRpcClient(anvil.url) as client:
            devnet = Devnet(client)
            await devnet.setup(tokens=1)
            deployed = int(await client.request("eth_blockNumber", []), 16)
            # Empty blocks, so that the node calls the deployment finalized.
            await client.request("anvil_mine", [hex(80)])
            head = int(await client.request("eth_blockNumber", []), 16)
        assert devnet.nfts is not None
        _made[anvil.url] = Devchain(devnet.tokens[0].address, devnet.nfts.erc721, deployed, head)
    made = _made[anvil.url]
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    await ingest(anvil.url, url, IngestOptions(confirmations=0, to_block=made.head))
    settings = ChainSettings(
        name="eth",
        chain_id=None,
        blockdb=BlockDbSettings(url=url, max_rows=1000),
        rpc=RpcSettings(url=anvil.url),
    )
    chains = await open_chains((settings,), finality_refresh_ms=1000)
    for chain_io in chains:
        assert isinstance(chain_io.finality, ChainFinality)
        await chain_io.finality.refresh()
    try:
        yield IoRouter(chains=chains), made
    finally:
        await close_chains(chains)


async def read(scope: TaskIoScope, op: str, *args: Any) -> Any:
    outcome = await scope.request("meta", op, list(args))
    assert isinstance(outcome, IoOk), outcome
    return outcome.decoded()


async def test_meta_chain_describes_the_chain_served(
    router: tuple[IoRouter, Devchain], anvil: Anvil
) -> None:
    io, made = router
    scope = TaskIoScope(io, "t-meta", chain="eth", code_epoch=7)
    chain = await read(scope, "chain")
    assert chain["name"] == "eth"
    assert chain["chain_id"] == anvil.options.chain_id
    assert chain["head"]["number"] == made.head
    assert made.deployed <= chain["finalized"] < made.head
    assert chain["ingested"] == {"from_block": 0, "to_block": made.head}
    assert chain["log_filter"] is None
    assert await read(scope, "code_epoch") == 7
    unknown = await scope.request("meta", "chain", ["base"])
    assert isinstance(unknown, IoFailed), unknown
    assert (unknown.kind, unknown.retryable) == ("UNKNOWN_CHAIN", False)
    assert unknown.message == "no chain 'base': this process serves eth"


async def test_meta_token_reads_erc20_and_erc721_and_no_code(
    router: tuple[IoRouter, Devchain],
) -> None:
    io, made = router
    scope = TaskIoScope(io, "t-token", chain="eth")
    token = await read(scope, "token", made.token, made.deployed)
    assert token == {
        "address": made.token.lower(),
        "block": made.deployed,
        "has_code": True,
        "name": "Test Token 0",
        "symbol": "TT0",
        "decimals": 18,
        "total_supply": str(TOKEN_SUPPLY),
    }
    # Pinned at a finalized block: the second read is the cache's.
    again = await scope.request("meta", "token", [made.token, made.deployed])
    assert isinstance(again, IoOk), again
    assert again.cached
    assert again.decoded() == token
    # Unpinned (the latest state): never cached.
    latest = await scope.request("meta", "token", [made.token])
    assert isinstance(latest, IoOk)
    assert not latest.cached
    unpinned = await scope.request("meta", "token", [made.token])
    assert isinstance(unpinned, IoOk), unpinned
    assert not unpinned.cached
    nft = await read(scope, "token", made.nft)
    assert (nft["name"], nft["symbol"]) == ("Test NFT", "TNFT")
    assert (nft["decimals"], nft["total_supply"], nft["block"]) == (None, None, None)
    nothing = await read(scope, "token", NO_CODE, made.head)
    assert nothing["has_code"] is False
    assert [nothing[f] for f in ("name", "symbol", "decimals", "total_supply")] == [None] * 4
    bad = await scope.request("meta", "token", ["0x12"])
    assert isinstance(bad, IoFailed), bad
    assert (bad.kind, bad.retryable) == ("BAD_REQUEST", False)
    # Before the contract existed (block 0), the token has no code there.
    assert (await read(scope, "token", made.token, 0))["has_code"] is False


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def test_the_decoders_refuse_what_is_not_the_abi_encoding_asked_for() -> None:
    text = _word(32) + _word(5) + b"hello".ljust(32, b"\0")
    assert decode_text(text) == "hello"
    assert decode_text(b"MKR".ljust(32, b"\0")) == "MKR"  # a bytes32 name
    assert decode_text(_word(32) + _word(500)) is None  # longer than the answer
    assert decode_text(_word(64) + _word(5)) is None  # the offset points outside
    assert decode_text(_word(32) + _word(MAX_TEXT_BYTES + 1) + bytes(2048)) is None
    assert decode_text(_word(32) + _word(2) + b"\xff\xfe".ljust(32, b"\0")) is None
    assert decode_text(b"") is None
    assert decode_uint(_word(18), 8) == 18
    assert decode_uint(_word(256), 8) is None
    assert decode_uint(_word(1) + _word(2), 256) is None
    assert decode_uint(b"\x01", 256) is None


async def test_meta_chain_of_a_selective_database_names_its_filter(
    router: tuple[IoRouter, Devchain], anvil: Anvil, tmp_path: Path
) -> None:
    _, made = router
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/selective.db")
    token = made.token.lower()
    only_token = LogQuery(addresses=(token,))
    await ingest(
        anvil.url, url, IngestOptions(confirmations=0, to_block=made.head, logs=only_token)
    )
    settings = ChainSettings(
        name="tokens",
        chain_id=anvil.options.chain_id,
        blockdb=BlockDbSettings(url=url, max_rows=10),
    )
    chains = await open_chains((settings,), finality_refresh_ms=1000)
    try:
        chain = await read(TaskIoScope(IoRouter(chains=chains), "t-sel"), "chain")
    finally:
        await close_chains(chains)
    assert chain["name"] == "tokens"
    assert chain["log_filter"] == {"addresses": [token], "topic0s": [], "from_block": 0}
    assert chain["head"]["number"] == made.head
