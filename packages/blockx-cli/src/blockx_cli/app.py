"""The ``blockx`` command line (typer + rich). Commands arrive with the client SDK."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="blockx",
    help="BlockX: run Python functions over blockchain data on a fleet of workers.",
    rich_markup_mode="rich",
    no_args_is_help=True,
)
console = Console()


def _show_version(value: bool) -> None:
    if value:
        console.print(f"blockx {version('blockx-cli')}")
        raise typer.Exit()


@app.callback()
def root(
    *,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """BlockX command line."""


@app.command()
def version_info() -> None:
    """Print the versions of the installed BlockX packages."""
    for package in ("blockx-cli", "blockx-client", "blockx-proto"):
        console.print(f"{package} {version(package)}")


def main() -> None:
    app()
