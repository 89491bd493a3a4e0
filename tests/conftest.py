"""Shared fixtures: real etcd servers (see blockx_server.etcd.local) and PostgreSQL.

* ``etcd_server``: one etcd for the whole session. Tests share it and isolate
  themselves by key prefix (``unique_lane``); they must not stop or kill it.
* ``etcd_factory``: etcds of a test's own, to kill, restart or compact, or to use
  the fixed legacy registry prefixes without meeting other tests' keys.
* ``postgres_server``: one PostgreSQL server for the session (tests/postgres.py);
  ``postgres_url``: a fresh database on it for one test, as a BLOCKDB_URL;
  ``db_url``: one on each engine; ``sink``: a sink store on it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import pytest
import pytest_asyncio
from postgres import PostgresServer, find_postgres_bin

from blockx_chain.devnet import Anvil
from blockx_chain.sink import SinkStore, open_sink
from blockx_chain.url import parse_blockdb_url
from blockx_core.registry import RegistryKind, v2_registry_prefix
from blockx_server.etcd.local import EtcdServer

# A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment. The
# CLI's rich console reads COLUMNS once, when blockx_cli is first imported, and would
# keep 80 columns for good; tests give each command the width they test instead.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


# The session etcd is an asyncio subprocess, which belongs to the loop that started
# it, so it lives on pytest-asyncio's session loop. Tests run on their own loops and
# only read its endpoint (no async call crosses loops), and etcd logs to a file, so
# nothing has to be pumped while the session loop sits idle between fixtures.
@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def etcd_server() -> AsyncIterator[EtcdServer]:
    async with EtcdServer() as server:
        yield server


@pytest_asyncio.fixture
async def etcd_factory() -> AsyncIterator[Callable[..., Awaitable[EtcdServer]]]:
    """``await etcd_factory(extra_args=[...])`` starts a private etcd, closed after the test."""
    servers: list[EtcdServer] = []

    async def start(*, extra_args: Sequence[str] = ()) -> EtcdServer:
        server = EtcdServer(extra_args=extra_args)
        servers.append(server)
        await server.start()
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
def unique_lane() -> Callable[..., str]:
    """``unique_lane(kind=RegistryKind.BLOCK)`` returns a v2 test registry prefix on a
    fresh random lane, e.g. ``/blockx/test/lanes/t-3f9c2a1b7d/workers/``."""

    def make(kind: RegistryKind = RegistryKind.BLOCK) -> str:
        return v2_registry_prefix("test", f"t-{secrets.token_hex(5)}", kind)

    return make


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.fail(
            "PostgreSQL is not installed: run scripts/setup.sh (apt-get install postgresql)"
        )
    server = PostgresServer(bin_dir)
    server.start()
    yield server
    server.stop()


@pytest_asyncio.fixture
async def postgres_url(postgres_server: PostgresServer) -> str:
    """A BLOCKDB_URL of an empty database of this test's own."""
    return await postgres_server.new_database()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL of this test's own, once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/chain.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest_asyncio.fixture
async def sink(db_url: str) -> AsyncIterator[SinkStore]:
    """A sink store on this test's own database (``db_url``: SQLite, then PostgreSQL)."""
    opened = await open_sink(parse_blockdb_url(db_url))
    yield opened
    await opened.close()


# --- anvil (a local Ethereum node) -------------------------------------------------
# One anvil per test module, started by blockx_chain.devnet (npm ci installs it). It is
# a plain subprocess, so tests on their own event loops can all use it; it mines only
# on request (--no-mining), so each module decides its chain through Devnet.


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    with Anvil() as node:
        yield node


# Screenshots and other files a test keeps for people to look at (not committed).
DASHBOARD_ARTIFACTS: Final = Path(__file__).resolve().parents[1] / "test-artifacts" / "dashboard"
_artifacts_used: list[Path] = []


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """``test-artifacts/dashboard/`` at the repository root, for the dashboard's
    screenshots; its path is printed at the end of the run."""
    DASHBOARD_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _artifacts_used.append(DASHBOARD_ARTIFACTS)
    return DASHBOARD_ARTIFACTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _artifacts_used:
        shots = sorted(p.name for p in DASHBOARD_ARTIFACTS.glob("*.png"))
        terminalreporter.write_line(
            f"dashboard screenshots in {DASHBOARD_ARTIFACTS}: {', '.join(shots)}"
        )
    _print_workers_summaries(terminalreporter)


# --- the summaries of pytest-xdist workers -------------------------------------------
# The suite runs on pytest-xdist workers (``-n`` in pyproject's addopts). The summaries
# the test folders' conftests print at the end of a run (the faults x invariants table,
# the doc blocks' tally, the screenshots) know what ran in their own process, and a
# worker prints nothing: each worker records what those hooks would print, sends it
# to the controller in ``workeroutput``, and the controller prints it here, the lines
# of one section (a tally run on several workers) gathered under one heading.

_SUMMARY_KEY: Final = "blockx_summary"
_TESTS_DIR: Final = Path(__file__).resolve().parent
# (section heading or "" for lines before any section, line) in the order received.
_workers_lines: list[tuple[str, str]] = []


class _SummaryRecorder:
    """The part of a TerminalReporter the conftests' summaries use, recording."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.section_title = ""
        self.lines: list[tuple[str, str]] = []

    def section(self, title: str, sep: str = "=", **markup: bool) -> None:
        self.section_title = title

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append((self.section_title, line))


def _is_tests_conftest(plugin: object) -> bool:
    file = getattr(plugin, "__file__", None)
    return file is not None and Path(file).resolve().is_relative_to(_TESTS_DIR)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput: dict[str, object] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is None:
        return  # not an xdist worker: the conftests print their summaries themselves
    recorder = _SummaryRecorder(session.config)
    hook = session.config.pluginmanager.hook.pytest_terminal_summary
    for impl in hook.get_hookimpls():
        if _is_tests_conftest(impl.plugin):
            recorder.section_title = ""
            given = {"terminalreporter": recorder, "config": session.config}
            impl.function(**{name: given.get(name, session.exitstatus) for name in impl.argnames})
    workeroutput[_SUMMARY_KEY] = recorder.lines


def pytest_testnodedown(node: object, error: object) -> None:
    """On the controller, as each worker finishes: keep its recorded summary lines."""
    lines = getattr(node, "workeroutput", {}).get(_SUMMARY_KEY, [])
    _workers_lines.extend((str(title), str(line)) for title, line in lines)


def _print_workers_summaries(terminalreporter: pytest.TerminalReporter) -> None:
    by_title: dict[str, list[str]] = {}
    for title, line in _workers_lines:
        lines = by_title.setdefault(title, [])
        if not (title == "" and line in lines):
            lines.append(line)
    for title, lines in by_title.items():
        if title:
            terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
