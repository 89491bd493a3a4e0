"""NFT transfers as a test reads them off a node's raw logs, decoded here from the
log's bytes (not by blockx_chain.schema), to check the nft_transfers rows against."""

from __future__ import annotations

from typing import Any, Final

# keccak256 of the event signatures (tests/chain/test_nft_transfers.py checks them
# against the node's web3_sha3).
TRANSFER: Final = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
TRANSFER_SINGLE: Final = "0xc3d58168c5ae7397731d063d5bbf3d657854427343f4c083240f7aacaa2d0f62"
TRANSFER_BATCH: Final = "0x4a39dc06d4c0dbc64b70af90fd698a233a518aa5d07e595d983b8c0526c8f7fb"


def _address(topic: str) -> str:
    return "0x" + topic[-40:].lower()


def _word(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 32], "big")


def _array(data: bytes, head: int) -> list[int] | None:
    if len(data) < head + 32:
        return None
    offset = _word(data, head)
    if offset + 32 > len(data):
        return None
    count = _word(data, offset)
    if offset + 32 + 32 * count > len(data):
        return None
    return [_word(data, offset + 32 * (i + 1)) for i in range(count)]


def decoded_transfers(log: dict[str, Any]) -> list[tuple[str, str | None, str, str, int, int]]:
    """``(standard, operator, from, to, token id, amount)`` per transfer in a node's
    log object; [] when it is no well-formed ERC-721 or ERC-1155 transfer."""
    topics = [t.lower() for t in log["topics"]]
    data = bytes.fromhex(log["data"][2:])
    if len(topics) != 4:
        return []
    if topics[0] == TRANSFER:
        if data:
            return []
        return [("erc721", None, _address(topics[1]), _address(topics[2]), int(topics[3], 16), 1)]
    operator, sender, receiver = (_address(t) for t in topics[1:])
    if topics[0] == TRANSFER_SINGLE:
        if len(data) != 64:
            return []
        return [("erc1155", operator, sender, receiver, _word(data, 0), _word(data, 32))]
    if topics[0] == TRANSFER_BATCH:
        ids, values = _array(data, 0), _array(data, 32)
        if ids is None or values is None or len(ids) != len(values):
            return []
        return [
            ("erc1155", operator, sender, receiver, token_id, amount)
            for token_id, amount in zip(ids, values, strict=True)
        ]
    return []


def nft_rows(
    block_number: int, block_hash: str, tx: dict[str, Any], log: dict[str, Any]
) -> list[dict[str, Any]]:
    """The nft_transfers rows a node's log (of transaction ``tx``) should give, as the
    store reads them back (uint256 values as decimal strings)."""
    return [
        {
            "block_number": block_number,
            "log_index": int(log["logIndex"], 16),
            "batch_position": position,
            "transaction_index": int(tx["transactionIndex"], 16),
            "transaction_hash": tx["hash"].lower(),
            "block_hash": block_hash.lower(),
            "standard": standard,
            "token": log["address"].lower(),
            "operator": operator,
            "from_address": sender,
            "to_address": receiver,
            "token_id": str(token_id),
            "amount": str(amount),
        }
        for position, (standard, operator, sender, receiver, token_id, amount) in enumerate(
            decoded_transfers(log)
        )
    ]
