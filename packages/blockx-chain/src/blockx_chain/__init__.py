"""Chain data of BlockX, with no server runtime: the block database's schema and
its access, the JSON-RPC client, chain ingest and the anvil devnet."""
