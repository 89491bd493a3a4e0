"""The lines ``blockx-dev --ready-json`` prints for the program that drives it
(``background.LocalCluster``), each a prefix and one JSON object."""

from typing import Final

# Every endpoint (``launcher.Endpoints``), once every process serves.
READY: Final = "BLOCKX_DEV_READY "
# The chain's addresses, as soon as anvil and the databases are up and before the
# BlockX processes serve: whatever drives the chain can start on it meanwhile.
CHAIN_READY: Final = "BLOCKX_DEV_CHAIN "
