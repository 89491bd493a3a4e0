"""The ``blockx`` executable's entry point.

``blockx chain ...`` (ingest, devnet) uses nothing of the cluster's client, and
loading every command's modules costs most of a second: a command line that
starts with ``chain`` gets an app of the chain commands alone, the same commands
with the same options and help. Every other command line gets the whole app
(``blockx_cli.app``).
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["chain"]:
        import typer

        from blockx_cli.commands.chain import group

        chain_only = typer.Typer(
            name="blockx", rich_markup_mode="rich", pretty_exceptions_enable=False
        )
        chain_only.add_typer(group, name="chain")
        chain_only()
        return
    from blockx_cli.app import main as whole

    whole()
