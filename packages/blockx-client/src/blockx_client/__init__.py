"""blockx_client."""
