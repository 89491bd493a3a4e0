"""Every ``blockx`` command imports only what it uses: the root imports no command's
module (``blockx --help`` lists them from ``blockx_cli.app.COMMANDS``), and a
command's module loads the launcher, the chain ingest (the node's HTTP client, the
PostgreSQL driver), the ABI library, the dashboard's web stack and the cluster's
client only in the commands that use them; a command of the cluster's client loads
neither the Worker's engine nor the dispatcher's."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from blockx_cli.app import COMMANDS, DEFAULT_COORDINATOR, DEFAULT_SYNC_INVOKER, app, load

HEAVY = (
    "httpx",
    "httpcore",
    "anyio",
    "asyncpg",
    "starlette",
    "uvicorn",
    "jinja2",
    "blockx_cli.devcluster",
    "faster_eth_abi",
    "eth_abi",
    "eth_hash",
    "pyiceberg",
    "pyarrow",
    "duckdb",
    "websockets",
)
# What a command that talks to the cluster loads: its gRPC client and etcd's.
CLUSTER = ("blockx_client", "grpclib", "aetcd", "betterproto2", "blockx_proto")
# The Worker's and the dispatcher's engines, which no client runs.
ENGINES = ("blockx_core.worker._core", "blockx_core.dispatch._core")
# What opens a block database or a sink.
STORES = ("asyncio", "blockx_chain.store.base", "blockx_chain.sink.base")


def _loaded(argv: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules under ``prefixes`` that ``blockx ARGV`` imported, run as the
    console script runs it."""
    probe = (
        "import json, sys\n"
        f"sys.argv = ['blockx', *{argv!r}]\n"
        "from blockx_cli.launch import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"prefixes = {prefixes!r}\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in prefixes or "
        "m.startswith(tuple(p + '.' for p in prefixes)) or m in prefixes)\n"
        "sys.stderr.write('\\nLOADED ' + json.dumps(loaded) + '\\n')\n"
    )
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    marker = done.stderr.rpartition("\nLOADED ")
    assert marker[1], done.stderr
    loaded: list[str] = json.loads(marker[2])
    return loaded


def test_the_command_line_loads_no_heavy_module_until_a_command_needs_it() -> None:
    probe = (
        "import json, sys, blockx_cli.app\n"
        f"heavy = {HEAVY + CLUSTER + ('blockx_cli.commands.workers',)!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(
    ("argv", "kept_out"),
    [
        (
            ["--version"],
            (*HEAVY, *CLUSTER, "msgspec", "asyncio", "blockx_core", "importlib.metadata"),
        ),
        (["--help"], (*HEAVY, *CLUSTER, "blockx_cli.commands.task", "blockx_cli.commands.drive")),
        (["workers", "--help"], (*HEAVY, *CLUSTER, "asyncio", "blockx_cli.commands.tasks")),
        (["chain", "ingest", "--help"], (*HEAVY, *CLUSTER, "asyncio", "blockx_chain.store")),
        (["backfill", "--help"], (*HEAVY, *CLUSTER, *STORES, "blockx_drive._backfill")),
        (["follow", "--help"], (*HEAVY, *CLUSTER, *STORES, "blockx_drive._follow")),
        # The client's listing types come from the cores' packages, not their engines.
        (["tasks", "--help"], ENGINES),
    ],
)
def test_each_command_imports_only_what_it_uses(argv: list[str], kept_out: tuple[str, ...]) -> None:
    assert _loaded(argv, kept_out) == []


def test_chain_ingest_talks_to_the_node_without_httpx(tmp_path: Path) -> None:
    """The JSON-RPC client's own HTTP/1.1 is all ingest loads of HTTP (h11 only once a
    connection is made)."""
    argv = ["chain", "ingest", "--rpc", "http://127.0.0.1:1", "--db", f"sqlite:///{tmp_path}/b.db"]
    loaded = _loaded([*argv, "--to", "10"], ("httpx", "httpcore", "anyio", "h11", "blockx_chain"))
    assert "blockx_chain.rpc.http" in loaded  # the probe saw the client run
    assert [m for m in loaded if not m.startswith("blockx_chain")] == []


def test_the_probe_sees_what_a_command_loads() -> None:
    """The probe above is not blind: a command whose module needs the client has it."""
    assert "blockx_client" in _loaded(["tasks", "--help"], CLUSTER)
    assert "blockx_cli.commands.workers" in _loaded(["workers", "--help"], ("blockx_cli",))


def _whole_root() -> TyperGroup:
    """The root with every command loaded, as it was before commands were lazy."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    for entry in COMMANDS:
        root.get_command(typer.Context(root), entry.name)
    return root


def test_the_command_table_says_what_each_command_says_of_itself() -> None:
    root = _whole_root()
    assert list(root.commands) == [e.name for e in COMMANDS]
    for entry in COMMANDS:
        command = root.commands[entry.name]
        assert command is not None
        assert isinstance(command, TyperGroup) == entry.group, entry.name
        first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        assert first.strip() == entry.short_help, entry.name
        assert not command.hidden
        assert not command.deprecated
        assert load(entry).name == entry.name


def test_the_root_help_lists_every_command_as_the_loaded_commands_do() -> None:
    runner = CliRunner()
    lazy = runner.invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert lazy.exit_code == 0, lazy.output
    whole = _whole_root()
    with typer.Context(whole, info_name="blockx") as ctx:
        shown = whole.get_help(ctx)
    for entry in COMMANDS:
        assert f" {entry.name} " in lazy.output
    lazy_ctx = typer.Context(typer.main.get_command(app), info_name="blockx")
    assert lazy_ctx.command.get_help(lazy_ctx) == shown


def test_the_version_printed_is_the_installed_packages() -> None:
    from importlib.metadata import version

    import blockx_cli

    assert blockx_cli.__version__ == version("blockx-cli")
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0
    assert done.output == f"blockx {version('blockx-cli')}\n"


def test_the_root_shows_the_clients_default_addresses() -> None:
    from blockx_client.client import DEFAULT_COORDINATOR as COORDINATOR
    from blockx_client.client import DEFAULT_SYNC_INVOKER as SYNC_INVOKER

    assert (DEFAULT_COORDINATOR, DEFAULT_SYNC_INVOKER) == (COORDINATOR, SYNC_INVOKER)


def test_the_drivers_names_load_on_first_use() -> None:
    """``blockx_drive`` names what it always named; each loads its module when read."""
    import blockx_drive
    from blockx_drive import _backfill, _follow, defaults, jobs, submission

    for name in blockx_drive.__all__:
        assert getattr(blockx_drive, name) is not None, name
    assert blockx_drive.backfill is _backfill.backfill
    assert blockx_drive.follow is _follow.follow
    assert blockx_drive.OnFailure is defaults.OnFailure is _backfill.OnFailure
    assert blockx_drive.list_jobs is jobs.list_jobs
    assert blockx_drive.SubmissionRefused is submission.SubmissionRefused
    assert isinstance(blockx_drive.__version__, str)
    with pytest.raises(AttributeError, match="no_such_name"):
        blockx_drive.no_such_name  # noqa: B018


def test_the_stores_names_load_on_first_use() -> None:
    import blockx_chain.sink as sink_package
    import blockx_chain.store as store_package
    from blockx_chain.sink import base as sink_base
    from blockx_chain.sink import code, jobs
    from blockx_chain.store import base as store_base

    assert store_package.BlockStore is store_base.BlockStore
    assert store_package.BlockWriter is store_base.BlockWriter
    assert sink_package.SinkStore is sink_base.SinkStore
    assert sink_package.DEFAULT_CHUNK_ROWS == sink_base.DEFAULT_CHUNK_ROWS
    assert sink_package.DEFAULT_BLOCK_KEY == sink_base.DEFAULT_BLOCK_KEY
    assert sink_package.WriteKind is code.WriteKind
    assert sink_package.JobEntry is jobs.JobEntry
    for package in (sink_package, store_package):
        for name in package.__all__:
            assert getattr(package, name) is not None, name
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name  # noqa: B018


def test_the_ingest_names_still_load_on_first_use() -> None:
    import blockx_chain.ingest as ingest_package
    from blockx_chain.ingest import run

    assert ingest_package.ingest is run.ingest
    assert ingest_package.IngestOptions is run.IngestOptions
    with pytest.raises(AttributeError, match="no_such_name"):
        ingest_package.no_such_name  # noqa: B018
