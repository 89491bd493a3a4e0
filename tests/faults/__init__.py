"""The fault-injection suite (see test_faults.py and docs/faults.md)."""
