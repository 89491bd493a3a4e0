"""The Worker process."""
