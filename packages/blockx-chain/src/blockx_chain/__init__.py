"""Chain data of BlockX, with no server runtime: the block database's schema and its access."""
