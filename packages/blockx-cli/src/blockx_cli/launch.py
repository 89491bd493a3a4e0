"""The ``blockx`` executable's entry point.

Every command's module is imported when that command runs or shows its help
(``blockx_cli.app``). ``blockx chain ...`` (ingest, devnet) uses none of the root
options, which name the cluster: a command line that starts with ``chain`` gets an
app of the chain commands alone, the same commands with the same options and help.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["chain"]:
        from blockx_cli.app import chain_only

        chain_only()
        return
    from blockx_cli.app import main as whole

    whole()
