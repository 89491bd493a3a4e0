"""Versions: ``--version`` on the root, and ``version-info``."""

from __future__ import annotations

import typer

from blockx_cli.output import console

app = typer.Typer()

PACKAGES = ("blockx-cli", "blockx-client", "blockx-proto", "blockx-server")


def print_version(value: bool) -> None:
    """The root ``--version`` callback (the root imports this module for it)."""
    if value:
        from blockx_cli import __version__

        console.print(f"blockx {__version__}")
        raise typer.Exit()


@app.command()
def version_info() -> None:
    """Print the versions of the installed BlockX packages."""
    from importlib.metadata import PackageNotFoundError, version

    for package in PACKAGES:
        try:
            console.print(f"{package} {version(package)}")
        except PackageNotFoundError:
            console.print(f"{package} (not installed)")
