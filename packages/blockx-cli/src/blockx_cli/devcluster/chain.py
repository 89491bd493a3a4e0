"""The local cluster's chain: anvil, a block database, a sink database, and what feeds them.

``ChainStack`` starts anvil (``blockx_chain.devnet``, mining only on request) and
creates the block database (SQLite, schema applied) before the Workers start, so
they open it read-only. The sink database is a second file: a SQLite sink sharing
the block database's file would be busy under a following ingest. With ``feed``
it deploys test tokens, mines ``history_blocks`` blocks of transfers, keeps mining
one block every ``block_time_s`` seconds, and runs an ingest that follows the
head; without it the chain is left to whoever drives it (``blockx demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import IO, Final

import msgspec

from blockx_chain.devnet import Anvil, AnvilFailed, AnvilNotFound, AnvilOptions, Devnet
from blockx_chain.ingest import IngestError, IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient, RpcError
from blockx_chain.store import StoreError, open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.devcluster.ports import HOST
from blockx_cli.devcluster.processes import LaunchError

# How often the following ingest asks the node for its head.
FOLLOW_POLL_S: Final = 0.2
TOKENS: Final = 3


class ChainOptions(msgspec.Struct, frozen=True, kw_only=True):
    anvil_port: int | None = None  # None: a free port
    feed: bool = True
    history_blocks: int = 200
    block_time_s: float = 2.0  # 0: no live mining
    token_transfers: int = 4
    eth_transfers: int = 1


class ChainStack:
    """anvil on ``port`` (chosen by the launcher, so its URL is known before it
    starts), the two databases, and the feed."""

    def __init__(self, workdir: Path, options: ChainOptions, port: int, log: IO[str]) -> None:
        self.options = options
        self.block_db_url = f"sqlite:///{workdir / 'chain.db'}"
        self.sink_db_url = f"sqlite:///{workdir / 'sink.db'}"
        self.rpc_url = f"http://{HOST}:{port}"
        self.anvil: Anvil | None = None
        self.tokens: list[str] = []
        self._port = port
        self._log = log
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def check(self) -> list[str]:
        """What keeps the chain from starting, found before anything starts (the
        anvil binary: ANVIL_BIN, node_modules, PATH)."""
        try:
            self.anvil = Anvil(AnvilOptions(port=self._port))
        except AnvilNotFound as exc:
            return [f"cannot start anvil: {exc}"]
        return []

    async def start(self) -> None:
        """anvil, and the block database created (side by side: neither needs the other)."""
        if self.anvil is None and (problems := self.check()):
            raise LaunchError(problems[0])
        assert self.anvil is not None
        try:
            await asyncio.gather(asyncio.to_thread(self.anvil.start), self._create_block_db())
        except AnvilFailed as exc:
            raise LaunchError(f"cannot start anvil: {exc}") from None

    async def _create_block_db(self) -> None:
        try:
            store = await open_store(parse_blockdb_url(self.block_db_url))
            await store.close()
        except StoreError as exc:
            raise LaunchError(f"cannot create the block database: {exc}") from None

    async def start_feed(self) -> bool:
        """Tokens, history and live blocks on anvil, and the following ingest;
        False without ``feed``."""
        if not self.options.feed:
            return False
        client = JsonRpcClient(self.rpc_url)
        devnet = Devnet(client)
        try:
            await devnet.setup(TOKENS)
            o = self.options
            await devnet.mine(
                o.history_blocks, token_transfers=o.token_transfers, eth_transfers=o.eth_transfers
            )
        except RpcError as exc:
            await client.aclose()
            raise LaunchError(f"cannot fill the devnet: {exc}") from None
        self.tokens = [token.address for token in devnet.tokens]
        self._tasks.append(asyncio.create_task(self._follow()))
        if self.options.block_time_s > 0:
            self._tasks.append(asyncio.create_task(self._mine(devnet, client)))
        else:
            await client.aclose()
        return True

    async def _mine(self, devnet: Devnet, client: JsonRpcClient) -> None:
        try:
            o = self.options
            await devnet.run_live(
                o.block_time_s,
                self._stop,
                token_transfers=o.token_transfers,
                eth_transfers=o.eth_transfers,
            )
        except RpcError as exc:
            print(f"[devnet] live mining stopped: {exc}", file=self._log, flush=True)
        finally:
            await client.aclose()

    async def _follow(self) -> None:
        options = IngestOptions(follow=True, poll_interval_s=FOLLOW_POLL_S)
        db = parse_blockdb_url(self.block_db_url)
        try:
            summary = await ingest(self.rpc_url, db, options, stop=self._stop)
        except (IngestError, StoreError, RpcError) as exc:
            print(f"[ingest] stopped: {exc}", file=self._log, flush=True)
            return
        print(f"[ingest] stopped after {summary.blocks} blocks", file=self._log, flush=True)

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.anvil is not None:
            await asyncio.to_thread(self.anvil.stop)
            self.anvil = None
