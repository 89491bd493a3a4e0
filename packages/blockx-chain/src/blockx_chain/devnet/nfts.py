"""The devnet's NFTs: an ERC-721 and an ERC-1155 contract, and a few transfers of each.

The first account deploys both (``deploys``) and then sends every NFT transaction
itself (``transfers``), so their nonces fix their order inside the block: each mint
comes before the transfer of what it minted. Mints are transfers from the zero
address, so the block holds every shape ``nft_transfers`` derives: an ERC-721
``Transfer``, an ERC-1155 ``TransferSingle`` and a ``TransferBatch`` of two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from blockx_chain.contracts import (
    multi_mint_data,
    multi_token_deploy_data,
    nft_deploy_data,
    nft_mint_data,
    nft_transfer_from_data,
    safe_batch_transfer_from_data,
    safe_transfer_from_data,
)
from blockx_chain.rpc import quantity

NFT_DEPLOY_GAS: Final = 2_000_000
NFT_CALL_GAS: Final = 200_000


@dataclass(frozen=True)
class NftContracts:
    erc721: str
    erc1155: str


def deploys(owner: str) -> list[dict[str, Any]]:
    """The two deployments, ERC-721 first, from ``owner``."""
    return [
        _call(owner, None, nft_deploy_data("Test NFT", "TNFT"), NFT_DEPLOY_GAS),
        _call(owner, None, multi_token_deploy_data(), NFT_DEPLOY_GAS),
    ]


def transfers(nfts: NftContracts, owner: str, holders: list[str]) -> list[dict[str, Any]]:
    """Mints and transfers, all sent by ``owner`` (the contracts' minter): ERC-721
    ids 1-3 minted to the owner, 1 and 2 handed on, 4 minted straight to a holder;
    ERC-1155 ids 1 and 2 minted to the owner, some of id 1 handed on, and some of
    both handed on in one batch."""
    a, b, c = (holders[i % len(holders)] for i in range(3))
    nft, multi = nfts.erc721, nfts.erc1155
    calls = [
        *(nft_mint_data(owner, token_id) for token_id in (1, 2, 3)),
        nft_transfer_from_data(owner, a, 1),
        nft_transfer_from_data(owner, b, 2),
        nft_mint_data(c, 4),
    ]
    multi_calls = [
        multi_mint_data(owner, 1, 100),
        multi_mint_data(owner, 2, 50),
        safe_transfer_from_data(owner, a, 1, 10),
        safe_batch_transfer_from_data(owner, b, [1, 2], [5, 7]),
    ]
    return [_call(owner, nft, data, NFT_CALL_GAS) for data in calls] + [
        _call(owner, multi, data, NFT_CALL_GAS) for data in multi_calls
    ]


def _call(sender: str, to: str | None, data: str, gas: int) -> dict[str, Any]:
    tx: dict[str, Any] = {"from": sender, "gas": quantity(gas), "data": data}
    if to is not None:
        tx["to"] = to
    return tx
