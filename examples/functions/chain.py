"""Example functions over synthetic chain data, for `blockx demo`.

Each block's transactions are derived from the block number by hashing, so the
functions do real CPU work without a chain node; prices come from the Worker's
`memory` IO backend, and formatting is a sub-call.
"""

import hashlib

from blockx_executor import call, io


def _transactions(number):
    """Deterministic pseudo-transactions of a block: (value in wei, gas)."""
    seed = hashlib.sha3_256(number.to_bytes(8, "big")).digest()
    count = 40 + seed[0] % 80
    txs = []
    for i in range(count):
        seed = hashlib.sha3_256(seed + i.to_bytes(2, "big")).digest()
        value = int.from_bytes(seed[:8], "big") % (50 * 10**18)
        gas = 21_000 + int.from_bytes(seed[8:11], "big") % 200_000
        txs.append((value, gas))
    return txs


def _state_root(txs):
    """A stand-in for re-deriving a state root: a few milliseconds of hashing."""
    state = b"".join(value.to_bytes(16, "big") for value, _ in txs).ljust(1024, b"\0")[:1024]
    for _ in range(1500):
        state = hashlib.sha3_256(state).digest() * 32
    return state[:8].hex()


async def block_stats(number):
    """Per-block figures: transaction count, gas used, the largest transfer in USD."""
    txs = _transactions(number)
    price = await io.memory.get("price:ETH-USD", 0)
    largest = max(value for value, _ in txs)
    return {
        "block": number,
        "txs": len(txs),
        "gas": sum(gas for _, gas in txs),
        "largest_usd": await call("usd", largest, price),
        "root": _state_root(txs),
    }


def usd(wei, price):
    return round(wei / 10**18 * price, 2)
