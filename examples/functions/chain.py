"""Example functions over the block database's tables, for `blockx demo`.

`token_volume` is written for `unit: "block"`: it gets one block of
`erc20_transfers` rows as `{"block": <blocks row>, "rows": [...]}` and returns the
block's rows for a table writer, one per token. Token amounts are uint256 decimal
strings in the block database; they are summed as Python ints, so they stay exact
(write them into a NUMERIC column). `large_transfers` is written for `unit: "row"`:
one call per transfer. `swap` is written for `unit: "event"`: one call per `Swap`
of the devnet's pair, decoded by the Worker with the ABI registered as `pair`
(`blockx chain abi add`), so its amounts arrive as ints. `usd` is a plain function
for `blockx invoke`. `block_volume` reads one block's transfers itself, through
`io.blockdb`, for `blockx invoke` and `blockx replay`; `examples/tests` runs it offline
against the recording `examples/fixtures/block_volume.json`.
"""

from blockx_executor import io


def token_volume(arg):
    """Per token in one block: how many transfers, their total amount, distinct senders."""
    tokens = {}
    for row in arg["rows"]:
        entry = tokens.get(row["token"])
        if entry is None:
            entry = tokens[row["token"]] = [0, 0, set()]
        entry[0] += 1
        entry[1] += int(row["value"])
        entry[2].add(row["from_address"])
    return [
        {"token": token, "transfers": count, "volume": volume, "senders": len(senders)}
        for token, (count, volume, senders) in sorted(tokens.items())
    ]


async def block_volume(number):
    """``token_volume`` of block ``number``, read from the block database; None for a
    block it does not hold."""
    block = await io.blockdb.block(number)
    if block is None:
        return None
    rows = await io.blockdb.erc20_transfers(number)
    return token_volume({"block": block, "rows": rows})


def large_transfers(row, threshold=9 * 10**17):
    """One ERC-20 transfer: a row when its amount reaches ``threshold``, else nothing."""
    value = int(row["value"])
    if value < threshold:
        return None
    return {
        "log_index": row["log_index"],
        "token": row["token"],
        "from_address": row["from_address"],
        "to_address": row["to_address"],
        "value": value,
    }


def swap(arg):
    """One swap on the token/ETH pair: who traded and what went in and out (token0 is
    the token, token1 is ETH, as in Uniswap V2's ``Swap``)."""
    args = arg["event"]["args"]
    return {
        "log_index": arg["log"]["log_index"],
        "trader": args["sender"],
        "tokens_in": args["amount0In"],
        "eth_in": args["amount1In"],
        "tokens_out": args["amount0Out"],
        "eth_out": args["amount1Out"],
    }


def usd(wei, price):
    return round(wei / 10**18 * price, 2)
