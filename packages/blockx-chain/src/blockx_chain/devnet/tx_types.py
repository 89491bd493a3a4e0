"""One transaction of each type the devnet's node accepts, each a small ETH
transfer: legacy (0), access list (1, EIP-2930) and dynamic fee (2, EIP-1559) from
``typed_transactions``, blob (3, EIP-4844) from ``blob_transaction``.

The blob is all zeros: its KZG commitment and proof are then the point at infinity
(``0xc0`` and 47 zero bytes), so no KZG library is needed; anvil takes the blob,
commitment and proof as top-level fields of ``eth_sendTransaction``. Blob fee
fields without blobs make anvil panic, so only the type-3 transaction carries
them. anvil loads its KZG setup when it checks its first blob, which takes seconds:
the blob transaction is a block of its own that a caller asks for
(``Devnet.mine_blob_block``), not part of every devnet.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any, Final

from blockx_chain.rpc import quantity

GAS_PRICE: Final = 10**10  # 10 gwei: above any base fee the devnet reaches
PRIORITY_FEE: Final = 10**9
BLOB_GAS_PRICE: Final = 10**9
ACCESS_LIST_GAS: Final = 30_000  # 21,000 plus 2,400 per address and 1,900 per key
TRANSFER_GAS: Final = 21_000
BLOB_BYTES: Final = 131_072
ZERO_COMMITMENT: Final = "0xc0" + "00" * 47
_FEES: Final = {
    "maxFeePerGas": quantity(GAS_PRICE),
    "maxPriorityFeePerGas": quantity(PRIORITY_FEE),
}


class TxType(enum.IntEnum):
    LEGACY = 0
    ACCESS_LIST = 1
    DYNAMIC_FEE = 2
    BLOB = 3


def versioned_hash(commitment: str) -> str:
    """EIP-4844: the version byte 0x01, then the commitment's SHA-256 less its first byte."""
    digest = hashlib.sha256(bytes.fromhex(commitment.removeprefix("0x"))).digest()
    return "0x01" + digest[1:].hex()


def typed_transactions(sender: str, receiver: str, listed: str) -> list[dict[str, Any]]:
    """Types 0, 1 and 2 in order, from ``sender`` to ``receiver``; the access list
    names ``listed`` (a contract) and its first storage slot."""
    base = {"from": sender, "to": receiver, "value": quantity(1)}
    return [
        {
            **base,
            "type": _type(TxType.LEGACY),
            "gas": quantity(TRANSFER_GAS),
            "gasPrice": quantity(GAS_PRICE),
        },
        {
            **base,
            "type": _type(TxType.ACCESS_LIST),
            "gas": quantity(ACCESS_LIST_GAS),
            "gasPrice": quantity(GAS_PRICE),
            "accessList": [{"address": listed, "storageKeys": ["0x" + "00" * 32]}],
        },
        {**base, "type": _type(TxType.DYNAMIC_FEE), "gas": quantity(TRANSFER_GAS), **_FEES},
    ]


def blob_transaction(sender: str, receiver: str) -> dict[str, Any]:
    """A type-3 transaction from ``sender`` to ``receiver`` carrying one zero blob."""
    return {
        "from": sender,
        "to": receiver,
        "value": quantity(1),
        "type": _type(TxType.BLOB),
        "gas": quantity(TRANSFER_GAS),
        **_FEES,
        "maxFeePerBlobGas": quantity(BLOB_GAS_PRICE),
        "blobVersionedHashes": [versioned_hash(ZERO_COMMITMENT)],
        "blobs": ["0x" + "00" * BLOB_BYTES],
        "commitments": [ZERO_COMMITMENT],
        "proofs": [ZERO_COMMITMENT],
    }


def _type(kind: TxType) -> str:
    return quantity(kind.value)
