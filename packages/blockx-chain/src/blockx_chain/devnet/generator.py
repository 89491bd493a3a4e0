"""Devnet: fills an anvil with a chain of ERC-20 and ETH transfers, and swaps on an
AMM-style pair of a token and ETH (``setup_pair``, then ``mine(..., swaps=n)``).

``setup`` also deploys an ERC-721 and an ERC-1155 contract and moves a few NFTs
(``devnet.nfts``), and sends a transaction of types 0, 1 and 2
(``devnet.tx_types``); ``mine_blob_block`` adds a blob transaction (type 3).

Everything goes through batched raw JSON-RPC: each block is one batch of
``eth_sendTransaction`` from anvil's unlocked accounts (with an explicit ``gas``,
so the node does not estimate each one) followed by ``evm_mine [timestamp]``,
which seals them with the timestamp the caller chose. anvil runs a batch's
requests in their order, so one HTTP exchange makes one block (a run of blocks
goes through a ``JsonRpcLine`` of its own); the blocks are then
read back in batches of ``CHECK_BATCH`` and each is checked to hold exactly the
transactions sent for it. anvil must run with ``--no-mining`` (the default of
``AnvilOptions``) so no block is mined in between.

Transfers are drawn from a seeded ``random.Random``: the same seed on the same
chain gives the same blocks. A reorg reverts to an ``evm_snapshot`` taken before
an earlier block and mines a different branch (another seed, timestamps one
second later), so every block above the fork point gets a new hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any, Final

from blockx_chain.contracts import (
    PROBE_SELECTOR,
    SYNC_SELECTOR,
    approve_data,
    deploy_data,
    pair_deploy_data,
    swap_eth_for_tokens_data,
    swap_tokens_for_eth_data,
    transfer_data,
)
from blockx_chain.devnet import nfts as nft_txs
from blockx_chain.devnet.nfts import NftContracts
from blockx_chain.devnet.tx_types import blob_transaction, typed_transactions
from blockx_chain.rpc import JsonRpcClient, RpcError, RpcErrorKind, parse_quantity, quantity
from blockx_chain.rpc.line import JsonRpcLine

TOKEN_TRANSFER_GAS: Final = 100_000
ETH_TRANSFER_GAS: Final = 21_000
DEPLOY_GAS: Final = 2_000_000
TOKEN_SUPPLY: Final = 10**9 * 10**18
DEFAULT_BLOCK_INTERVAL_S: Final = 12
# Blocks read back (and checked) in one batch by ``mine``.
CHECK_BATCH: Final = 100
SWAP_GAS: Final = 200_000
PROBE_GAS: Final = 1_000_000
# The pair's reserves at the start: a million tokens against 1,000 ETH.
PAIR_TOKENS: Final = 10**6 * 10**18
PAIR_ETH: Final = 10**3 * 10**18
# One swap in this many is a probe() instead: a frame of every kind.
PROBE_ONE_IN: Final = 8


@dataclass(frozen=True)
class BlockShape:
    """What ``mine`` puts in each block: ERC-20 transfers, ETH transfers, and trades
    on the pair (``setup_pair`` first; each trade logs a token Transfer, a Swap and a
    Sync)."""

    token_transfers: int = 8
    eth_transfers: int = 4
    swaps: int = 0


# Dense blocks, as on a busy mainnet: about 150 transactions and 400 logs a block.
DENSE: Final = BlockShape(token_transfers=10, eth_transfers=0, swaps=140)


@dataclass(frozen=True)
class Token:
    address: str
    symbol: str


@dataclass(frozen=True)
class MinedBlock:
    number: int
    hash: str
    timestamp: int
    transactions: int


@dataclass(frozen=True)
class Reorg:
    fork_block_number: int  # the last block both branches share
    depth: int  # blocks of the old branch abandoned
    old_hashes: dict[int, str]
    new_blocks: list[MinedBlock]


@dataclass
class Devnet:
    """``Devnet(client)``; ``await setup(tokens=3)``; ``await mine(100)``; ``await reorg(5)``."""

    client: JsonRpcClient
    interval_s: int = DEFAULT_BLOCK_INTERVAL_S
    seed: int = 1
    accounts: list[str] = field(default_factory=list, init=False)
    tokens: list[Token] = field(default_factory=list, init=False)
    nfts: NftContracts | None = field(default=None, init=False)
    # Block n's timestamp is genesis_timestamp + n * interval_s (read in setup).
    genesis_timestamp: int = field(default=0, init=False)
    # Snapshots taken before a block was mined, by the number of the block below it.
    _marks: dict[int, str] = field(default_factory=dict, init=False)
    # Each branch draws its transfers from its own seeded generator.
    _branch: int = field(default=0, init=False)
    _rng: random.Random = field(init=False)
    # The head's number as this Devnet last mined or reverted it (None: ask the node).
    _head: int | None = field(default=None, init=False)
    # The AMM-style pair of the first token and ETH, once ``setup_pair`` deployed it.
    pair: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}/0")

    async def setup(self, tokens: int = 3, *, reorgable: bool = False) -> list[MinedBlock]:
        """Deploy ``tokens`` test tokens, an ERC-721 and an ERC-1155 from the first
        account (one block), then hand every account a share of each token, mint and
        move a few NFTs, and send a legacy, an access-list and a dynamic-fee
        transaction (a second block). Every transaction of both blocks must succeed."""
        self.accounts = [str(a) for a in await self.client.request("eth_accounts")]
        genesis = await self.client.request("eth_getBlockByNumber", ["0x0", False])
        self.genesis_timestamp = parse_quantity(genesis["timestamp"])
        if len(self.accounts) < 2:
            raise RpcError(RpcErrorKind.BAD_REQUEST, "the devnet needs at least 2 accounts")
        owner = self.accounts[0]
        deploys = [
            _send(
                owner, None, DEPLOY_GAS, data=deploy_data(f"Test Token {i}", f"TT{i}", TOKEN_SUPPLY)
            )
            for i in range(tokens)
        ]
        blocks = [await self.mine_block([*deploys, *nft_txs.deploys(owner)], reorgable)]
        receipts = await self._succeeded(blocks[0], "a deployment")
        created = [str(r["contractAddress"]) for r in receipts]
        self.tokens = [Token(address, f"TT{i}") for i, address in enumerate(created[:tokens])]
        self.nfts = NftContracts(*created[tokens:])
        share = TOKEN_SUPPLY // (2 * len(self.accounts))
        hand_out = [
            _send(owner, token.address, TOKEN_TRANSFER_GAS, data=transfer_data(holder, share))
            for token in self.tokens
            for holder in self.accounts[1:]
        ]
        blocks.append(await self.mine_block([*hand_out, *self._showcase()], reorgable))
        await self._succeeded(blocks[1], "a setup transaction")
        return blocks

    def _showcase(self) -> list[dict[str, Any]]:
        """NFT mints and transfers from the first account, then a transaction of
        types 0, 1 and 2 from the last."""
        assert self.nfts is not None
        owner, *holders = self.accounts
        showcase = nft_txs.transfers(self.nfts, owner, holders)
        return showcase + typed_transactions(holders[-1], owner, self.nfts.erc721)

    async def mine_blob_block(self, *, reorgable: bool = False) -> MinedBlock:
        """Mine a block holding one blob (type-3) transaction, from the last account
        to the first. The node's first blob costs it seconds (it loads its KZG
        setup), so it is asked for, not part of ``setup``."""
        if not self.accounts:
            raise ValueError("run setup before mine_blob_block")
        tx = blob_transaction(self.accounts[-1], self.accounts[0])
        block = await self.mine_block([tx], reorgable)
        await self._succeeded(block, "the blob transaction")
        return block

    async def _succeeded(self, block: MinedBlock, what: str) -> list[dict[str, Any]]:
        """``block``'s receipts, each checked to report success."""
        receipts = await self.client.request("eth_getBlockReceipts", [quantity(block.number)])
        if not isinstance(receipts, list) or len(receipts) != block.transactions:
            raise RpcError(RpcErrorKind.BAD_REQUEST, f"block {block.number} lacks receipts")
        if any(r.get("status") != "0x1" for r in receipts):
            raise RpcError(RpcErrorKind.BAD_REQUEST, f"{what} failed in block {block.number}")
        return receipts

    async def setup_pair(self, *, reorgable: bool = False) -> list[MinedBlock]:
        """Deploy the pair of the first token and ETH (one block), then give it its
        reserves and let every account trade on it (a second block: the token and
        ETH sent to it, ``sync()``, and each account's approval)."""
        if not self.tokens:
            raise ValueError("setup_pair needs a token: call setup first")
        owner = self.accounts[0]
        token = self.tokens[0].address
        deploy = _send(owner, None, DEPLOY_GAS, data=pair_deploy_data(token))
        blocks = [await self.mine_block([deploy], reorgable)]
        receipts = await self._succeeded(blocks[0], "the pair's deployment")
        pair = str(receipts[0]["contractAddress"])
        funding = [
            _send(owner, token, TOKEN_TRANSFER_GAS, data=transfer_data(pair, PAIR_TOKENS)),
            _send(owner, pair, SWAP_GAS, data=SYNC_SELECTOR, value=PAIR_ETH),
            *(
                _send(holder, token, TOKEN_TRANSFER_GAS, data=approve_data(pair, 2**256 - 1))
                for holder in self.accounts
            ),
        ]
        blocks.append(await self.mine_block(funding, reorgable))
        self.pair = pair
        return blocks

    def _swaps(self, count: int) -> list[dict[str, Any]]:
        """``count`` trades on the pair (none before ``setup_pair``): ETH for tokens or
        tokens for ETH, and one in ``PROBE_ONE_IN`` a ``probe()``, which creates,
        pays, fails inside and destroys contracts."""
        if self.pair is None:
            return []
        rng = self._rng
        txs = []
        for _ in range(count):
            trader, receiver = rng.sample(self.accounts, 2)
            pick = rng.randrange(2 * PROBE_ONE_IN)
            if pick < 2:
                value = rng.randrange(2, 10**15)
                txs.append(_send(trader, self.pair, PROBE_GAS, data=PROBE_SELECTOR, value=value))
            elif pick % 2:
                data = swap_eth_for_tokens_data(receiver)
                value = rng.randrange(1, 10**16)
                txs.append(_send(trader, self.pair, SWAP_GAS, data=data, value=value))
            else:
                data = swap_tokens_for_eth_data(rng.randrange(1, 10**18), receiver)
                txs.append(_send(trader, self.pair, SWAP_GAS, data=data))
        return txs

    async def head(self) -> dict[str, Any]:
        block = await self.client.request("eth_getBlockByNumber", ["latest", False])
        if not isinstance(block, dict):
            raise RpcError(RpcErrorKind.NOT_FOUND, "the node has no latest block")
        return block

    async def mine(
        self,
        blocks: int,
        *,
        token_transfers: int = 8,
        eth_transfers: int = 4,
        reorgable: bool = False,
        swaps: int = 0,
    ) -> list[MinedBlock]:
        """Mine ``blocks`` blocks, each ``interval_s`` after the one below, holding
        ``token_transfers`` ERC-20 and ``eth_transfers`` ETH transfers, and ``swaps``
        trades on the pair once ``setup_pair`` made it: one JSON-RPC
        batch per block, and one more per ``CHECK_BATCH`` blocks to read them back.
        With ``reorgable`` a snapshot is taken before each block, so ``reorg`` can
        fork there (and each block is read back on its own)."""
        if reorgable:
            return [
                await self.mine_block(self._transfers(token_transfers, eth_transfers, swaps), True)
                for _ in range(blocks)
            ]
        if self._head is None:
            self._head = parse_quantity((await self.head())["number"])
        mined: list[MinedBlock] = []
        sent: dict[int, int] = {}  # transactions sent, by block number
        async with self._line(blocks) as line:
            for _ in range(blocks):
                txs = self._transfers(token_transfers, eth_transfers, swaps)
                number = self._head + 1
                await self._send_and_mine(txs, self._timestamp_of(number), line)
                self._head = number
                sent[number] = len(txs)
                if len(sent) == CHECK_BATCH:
                    mined += await self._read_back(sent)
                    sent = {}
        return mined + await self._read_back(sent)

    def _line(self, blocks: int) -> contextlib.AbstractAsyncContextManager[JsonRpcLine | None]:
        """A connection of its own for a run of blocks from a plain http:// node (a
        sixth of the client's CPU per exchange); else the client (None)."""
        if blocks < 2 or not self.client.url.startswith("http://"):
            return contextlib.nullcontext(None)
        return JsonRpcLine(self.client)

    async def _read_back(self, sent: dict[int, int]) -> list[MinedBlock]:
        """The blocks of ``sent``, each checked to hold the transactions sent for it."""
        blocks = await self.client.batch(
            [("eth_getBlockByNumber", [quantity(number), False]) for number in sent]
        )
        return [
            self._checked(number, block, count)
            for (number, count), block in zip(sent.items(), blocks, strict=True)
        ]

    @staticmethod
    def _checked(number: int, block: Any, sent: int) -> MinedBlock:
        if not isinstance(block, dict):
            raise RpcError(RpcErrorKind.NOT_FOUND, f"block {number} was not mined")
        if len(block["transactions"]) != sent:
            raise RpcError(
                RpcErrorKind.BAD_REQUEST,
                f"block {number} holds {len(block['transactions'])} of {sent} "
                "transactions: is anvil mining by itself (run it with --no-mining)?",
            )
        return MinedBlock(number, str(block["hash"]), parse_quantity(block["timestamp"]), sent)

    async def reorg(
        self,
        depth: int,
        *,
        new_blocks: int | None = None,
        token_transfers: int = 8,
        eth_transfers: int = 4,
        swaps: int = 0,
    ) -> Reorg:
        """Abandon the top ``depth`` blocks and mine ``new_blocks`` (default ``depth``)
        different ones on the block below them. Those blocks must have been mined
        with ``reorgable=True``."""
        if depth < 1:
            raise ValueError("a reorg abandons at least one block")
        head = parse_quantity((await self.head())["number"])
        fork = head - depth
        snapshot = self._marks.get(fork)
        if snapshot is None:
            raise ValueError(
                f"no snapshot before block {fork + 1}: mine the blocks to reorg with reorgable=True"
            )
        old = await asyncio.gather(
            *(
                self.client.request("eth_getBlockByNumber", [quantity(n), False])
                for n in range(fork + 1, head + 1)
            )
        )
        old_hashes = {parse_quantity(b["number"]): str(b["hash"]) for b in old}
        if await self.client.request("evm_revert", [snapshot]) is not True:
            raise RpcError(RpcErrorKind.BAD_REQUEST, f"evm_revert {snapshot} was refused")
        self._head = fork
        for number in [n for n in self._marks if n >= fork]:
            del self._marks[number]
        # Another branch: other transfers, and timestamps one second later than the
        # abandoned blocks had, so no new block can equal an old one.
        self._branch += 1
        self._rng = random.Random(f"{self.seed}/{self._branch}")
        branch = []
        for _ in range(depth if new_blocks is None else new_blocks):
            txs = self._transfers(token_transfers, eth_transfers, swaps)
            branch.append(await self.mine_block(txs, True, shift_s=1))
        return Reorg(fork, depth, old_hashes, branch)

    async def run_live(
        self,
        block_time_s: float,
        stop: asyncio.Event,
        *,
        token_transfers: int = 8,
        eth_transfers: int = 4,
        swaps: int = 0,
    ) -> int:
        """Mine a block of transfers every ``block_time_s`` seconds (wall clock) until
        ``stop`` is set; the blocks' timestamps still step by ``interval_s``."""
        count = 0
        while not stop.is_set():
            await self.mine(
                1, token_transfers=token_transfers, eth_transfers=eth_transfers, swaps=swaps
            )
            count += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), block_time_s)
        return count

    def _transfers(
        self, token_transfers: int, eth_transfers: int, swaps: int = 0
    ) -> list[dict[str, Any]]:
        rng = self._rng
        txs = []
        holders = self.accounts
        for _ in range(token_transfers if self.tokens else 0):
            token = rng.choice(self.tokens)
            sender, receiver = rng.sample(holders, 2)
            value = rng.randrange(1, 10**18)
            txs.append(
                _send(
                    sender, token.address, TOKEN_TRANSFER_GAS, data=transfer_data(receiver, value)
                )
            )
        for _ in range(eth_transfers):
            sender, receiver = rng.sample(holders, 2)
            txs.append(_send(sender, receiver, ETH_TRANSFER_GAS, value=rng.randrange(1, 10**15)))
        return txs + self._swaps(swaps)

    async def mine_block(
        self, txs: list[dict[str, Any]], reorgable: bool = False, shift_s: int = 0
    ) -> MinedBlock:
        """Mine one block holding exactly ``txs`` (``eth_sendTransaction`` objects from
        unlocked accounts, with ``gas``), stamped ``interval_s`` after the one below
        (plus ``shift_s``)."""
        if self._head is None:
            self._head = parse_quantity((await self.head())["number"])
        number = self._head
        if reorgable:
            self._marks[number] = str(await self.client.request("evm_snapshot"))
        await self._send_and_mine(txs, self._timestamp_of(number + 1) + shift_s)
        block = await self.client.request("eth_getBlockByNumber", [quantity(number + 1), False])
        mined = self._checked(number + 1, block, len(txs))
        self._head = number + 1
        return mined

    async def _send_and_mine(
        self, txs: list[dict[str, Any]], timestamp: int, line: JsonRpcLine | None = None
    ) -> None:
        """One block of ``txs``: batches of transactions one after another, the last
        with ``evm_mine``, through ``line`` if given. Batches sent side by side would
        race for one sender's nonces (the node answers "replacement transaction
        underpriced")."""
        send = self.client.batch if line is None else line.batch
        sends: list[tuple[str, list[Any]]] = [("eth_sendTransaction", [tx]) for tx in txs]
        step = self.client.max_batch - 1
        while len(sends) > step:
            await send(sends[:step])
            sends = sends[step:]
        await send([*sends, ("evm_mine", [timestamp])])

    def _timestamp_of(self, number: int) -> int:
        return self.genesis_timestamp + number * self.interval_s


def _send(
    sender: str, to: str | None, gas: int, *, data: str = "0x", value: int = 0
) -> dict[str, Any]:
    tx: dict[str, Any] = {"from": sender, "gas": quantity(gas), "data": data}
    if to is not None:
        tx["to"] = to
    if value:
        tx["value"] = quantity(value)
    return tx
