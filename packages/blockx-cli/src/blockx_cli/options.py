"""Options several commands take, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from blockx_cli.addresses import host_port_option
from blockx_client import Cluster

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ClusterOpt = Annotated[
    Cluster | None, typer.Option(case_sensitive=False, help="Override the task's cluster routing.")
]
WorkerOpt = Annotated[str, typer.Option(callback=host_port_option, help="The worker's host:port.")]
