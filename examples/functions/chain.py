"""Example functions over the block database's tables, for `blockx demo`.

`token_volume` is written for `unit: "block"`: it gets one block of
`erc20_transfers` rows as `{"block": <blocks row>, "rows": [...]}` and returns the
block's rows for a table writer, one per token. Token amounts are uint256 decimal
strings in the block database; they are summed as Python ints, so they stay exact
(write them into a NUMERIC column). `large_transfers` is written for `unit: "row"`:
one call per transfer. `usd` is a plain function for `blockx invoke`.
"""


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


def usd(wei, price):
    return round(wei / 10**18 * price, 2)
