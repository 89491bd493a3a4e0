"""``blockx demo``: ``run`` holds the stages; ``chain``, ``backfill`` and ``live`` do
them, ``job`` says what they compute, ``report`` reads and checks the results."""

from blockx_cli.devcluster.demo.chain import Transfers
from blockx_cli.devcluster.demo.run import DemoOptions, demo

__all__ = ["DemoOptions", "Transfers", "demo"]
