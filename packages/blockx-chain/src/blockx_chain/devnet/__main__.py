"""``python -m blockx_chain.devnet`` (``blockx-chain-devnet``): start anvil and fill it.

Starts anvil on 127.0.0.1 (a free port unless --port), deploys --tokens test tokens
(and, with --swaps, the AMM-style pair of the first and ETH), mines --blocks blocks
of transfers (and --swaps trades on the pair; --dense: about 150 transactions and
400 logs a block) --interval seconds apart from
--timestamp, optionally reorgs the top --reorg-depth blocks, prints one JSON line
(``{"url", "chain_id", "head", "tokens", "pair", "accounts"}``), then keeps anvil running
(mining a block every --block-time seconds when given) until SIGINT/SIGTERM, or
exits at once with --exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import signal
import sys

from blockx_chain.devnet.anvil import (
    DEFAULT_CHAIN_ID,
    DEFAULT_GENESIS_TIMESTAMP,
    Anvil,
    AnvilFailed,
    AnvilNotFound,
    AnvilOptions,
)
from blockx_chain.devnet.generator import DEFAULT_BLOCK_INTERVAL_S, DENSE, Devnet
from blockx_chain.rpc import JsonRpcClient, RpcError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockx-chain-devnet", description=__doc__)
    version = importlib.metadata.version("blockx-chain")
    parser.add_argument("--version", action="version", version=f"blockx-chain-devnet {version}")
    parser.add_argument("--blocks", type=int, default=100, help="blocks of transfers to mine")
    parser.add_argument("--tokens", type=int, default=3, help="test tokens to deploy")
    parser.add_argument("--token-transfers", type=int, default=8, help="per block")
    parser.add_argument("--eth-transfers", type=int, default=4, help="per block")
    parser.add_argument(
        "--swaps", type=int, default=0, help="per block, on a token/ETH pair (0: no pair)"
    )
    parser.add_argument(
        "--dense",
        action="store_true",
        help="dense blocks (about 150 transactions and 400 logs each): "
        f"{DENSE.token_transfers} token transfers and {DENSE.swaps} swaps a block, "
        "instead of --token-transfers, --eth-transfers and --swaps",
    )
    parser.add_argument("--timestamp", type=int, default=DEFAULT_GENESIS_TIMESTAMP)
    parser.add_argument("--interval", type=int, default=DEFAULT_BLOCK_INTERVAL_S)
    parser.add_argument("--chain-id", type=int, default=DEFAULT_CHAIN_ID)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reorg-depth", type=int, default=0, help="reorg the top N blocks")
    parser.add_argument("--block-time", type=float, default=None, help="keep mining, seconds")
    parser.add_argument("--exit", action="store_true", help="stop anvil once generated")
    return parser


async def _generate(url: str, args: argparse.Namespace) -> dict[str, object]:
    if args.dense:
        args.token_transfers, args.eth_transfers = DENSE.token_transfers, DENSE.eth_transfers
        args.swaps = DENSE.swaps
    async with JsonRpcClient(url) as client:
        devnet = Devnet(client, interval_s=args.interval, seed=args.seed)
        reorgable = args.reorg_depth > 0
        await devnet.setup(args.tokens)
        if args.swaps > 0:
            await devnet.setup_pair(reorgable=reorgable)
        transfers = {
            "token_transfers": args.token_transfers,
            "eth_transfers": args.eth_transfers,
            "swaps": args.swaps,
        }
        await devnet.mine(args.blocks, reorgable=reorgable, **transfers)
        if reorgable:
            await devnet.reorg(args.reorg_depth, **transfers)
        head = await devnet.head()
        summary: dict[str, object] = {
            "url": url,
            "chain_id": args.chain_id,
            "head": int(head["number"], 16),
            "tokens": [token.address for token in devnet.tokens],
            "pair": devnet.pair,
            "accounts": devnet.accounts,
        }
        print(json.dumps(summary), flush=True)
        if not args.exit:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if args.block_time is not None:
                await devnet.run_live(args.block_time, stop, **transfers)
            else:
                await stop.wait()
        return summary


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = AnvilOptions(chain_id=args.chain_id, timestamp=args.timestamp, port=args.port)
    try:
        with Anvil(options) as node:
            asyncio.run(_generate(node.url, args))
    except (AnvilNotFound, AnvilFailed, RpcError) as exc:
        print(f"blockx-chain-devnet: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
