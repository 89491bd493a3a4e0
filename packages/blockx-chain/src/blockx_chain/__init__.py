"""BlockX chain data: what the server's backends, the CLI and the client share about a chain."""
