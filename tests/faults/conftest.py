"""The fault-injection suite's cluster fixture and its faults x invariants table.

``cluster`` is module-scoped and parametrised (indirectly) by the network it
runs on, ``"netns"`` or ``"proxy"``, so one cluster serves every fault of one
network; it runs on the module's event loop, where the proxies of the proxy
network relay. The table of every fault run is printed in the terminal summary
and written to ``faults-table.txt`` in pytest's base temporary directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from faults import netns
from faults.cluster import FaultCluster, NetnsTopology, ProxyTopology, Topology
from faults.report import REPORT

_TABLE_FILE = "faults-table.txt"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FaultCluster]:
    kind: str = request.param
    if kind == "netns":
        reason = netns.unavailable_reason()
        if reason is not None:
            pytest.fail(f"BLOCKX_FAULTS_NETWORK=netns, but {reason}")
        netns.remove_leftovers()
    topology: Topology | None = None
    made: FaultCluster | None = None
    try:
        # Inside the try: the finalizer removes the namespaces and links made so
        # far, whatever fails.
        topology = NetnsTopology() if kind == "netns" else ProxyTopology()
        made = FaultCluster(topology, tmp_path_factory.mktemp(f"faults-{kind}"))
        await made.start()
        yield made
    finally:
        if made is not None:
            await made.close()
        elif topology is not None:
            await topology.close()


@pytest.fixture(scope="session", autouse=True)
def _faults_table(tmp_path_factory: pytest.TempPathFactory) -> object:
    yield None
    if REPORT.rows:
        path = Path(tmp_path_factory.getbasetemp()) / _TABLE_FILE
        path.write_text(REPORT.render() + "\n")
        REPORT.path = str(path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT.rows:
        return
    terminalreporter.section("faults x invariants")
    for line in REPORT.render().splitlines():
        terminalreporter.write_line(line)
    for row in REPORT.rows:
        for violation in row.violations:
            terminalreporter.write_line(f"✗ {row.fault} ({row.network}): {violation}")
        for note in row.notes:
            terminalreporter.write_line(f"  {row.fault} ({row.network}): {note}")
    if REPORT.path:
        terminalreporter.write_line(f"(written to {REPORT.path})")
