"""Every ``blockx`` command pays for what ``blockx_cli.app`` imports: the launcher,
the chain ingest (the node's HTTP client, the PostgreSQL driver), the ABI library and
the dashboard's
web stack load only in the commands that use them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "httpx",
    "asyncpg",
    "starlette",
    "uvicorn",
    "jinja2",
    "blockx_cli.devcluster",
    "faster_eth_abi",
    "eth_abi",
    "eth_hash",
    "websockets",
)


def test_the_command_line_loads_no_heavy_module_until_a_command_needs_it() -> None:
    probe = (
        "import json, sys, blockx_cli.app\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_ingest_names_still_load_on_first_use() -> None:
    import blockx_chain.ingest as ingest_package
    from blockx_chain.ingest import run

    assert ingest_package.ingest is run.ingest
    assert ingest_package.IngestOptions is run.IngestOptions
    with pytest.raises(AttributeError, match="no_such_name"):
        ingest_package.no_such_name  # noqa: B018
