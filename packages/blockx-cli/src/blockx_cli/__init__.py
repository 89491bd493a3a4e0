"""blockx_cli."""
