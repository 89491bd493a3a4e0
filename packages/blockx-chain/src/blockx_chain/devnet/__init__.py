"""A local Ethereum devnet for tests and the demo: anvil plus a transfer generator."""

from blockx_chain.devnet.anvil import (
    Anvil,
    AnvilFailed,
    AnvilNotFound,
    AnvilOptions,
    find_anvil,
)
from blockx_chain.devnet.generator import DENSE, BlockShape, Devnet, MinedBlock, Reorg, Token
from blockx_chain.devnet.nfts import NftContracts

__all__ = [
    "DENSE",
    "Anvil",
    "AnvilFailed",
    "AnvilNotFound",
    "AnvilOptions",
    "BlockShape",
    "Devnet",
    "MinedBlock",
    "NftContracts",
    "Reorg",
    "Token",
    "find_anvil",
]
