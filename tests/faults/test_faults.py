"""Faults under load on a six-host cluster, each followed by every invariant
(faults/scenario.py says which); the table of all runs ends the pytest output.

Networks: by default every fault runs on network namespaces (where this host
allows them) and the partition and the worker kill run again over the TCP-proxy
partitioner, so both partition paths are tested in the default run. Where
namespaces are not allowed, every fault runs over the proxies.
``BLOCKX_FAULTS_NETWORK=proxy`` (or ``netns``) runs every fault on that network
only.
"""

from __future__ import annotations

import os
from typing import Any, Final

import pytest

from faults import netns
from faults.cluster import FaultCluster
from faults.report import REPORT, FaultRow
from faults.scenario import FAULTS, Fault, exercise

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The faults that the default run repeats over the proxies: the partition (the
# proxies' own path) and a kill (restarts behind a proxy).
_ON_PROXY_TOO: Final = frozenset({"partition a worker", "kill -9 a worker"})


def _networks() -> tuple[str | None, tuple[Fault, ...], str | None]:
    """Why the faults do not run on namespaces (None: they do), which faults run
    over the proxies, and why none do (None: some do)."""
    forced = os.environ.get("BLOCKX_FAULTS_NETWORK", "")
    assert forced in ("", "netns", "proxy"), f"BLOCKX_FAULTS_NETWORK={forced!r}"
    if forced == "proxy":
        return "BLOCKX_FAULTS_NETWORK=proxy", FAULTS, None
    if forced == "netns":
        return None, FAULTS, "BLOCKX_FAULTS_NETWORK=netns"
    reason = netns.unavailable_reason()
    if reason is not None:
        why = f"network namespaces unavailable ({reason}): the faults run over the proxies"
        return why, FAULTS, None
    return None, tuple(f for f in FAULTS if f.name in _ON_PROXY_TOO), None


NOT_ON_NETNS, ON_PROXY, NOT_ON_PROXY = _networks()


def _params(faults: tuple[Fault, ...]) -> list[Any]:
    """One param per fault, named after it."""
    return [pytest.param(f, id=f.name) for f in faults]


async def _run(cluster: FaultCluster, fault: Fault) -> None:
    row = FaultRow(fault=fault.name, network=cluster.kind)
    REPORT.rows.append(row)
    await exercise(cluster, fault, row)
    assert row.violations == []


# One value of ``cluster`` per test function: pytest keeps a module-scoped fixture
# only while the parameter index stays the same, so every fault of one network
# shares one cluster.
@pytest.mark.skipif(NOT_ON_NETNS is not None, reason=str(NOT_ON_NETNS))
@pytest.mark.parametrize("cluster", ["netns"], indirect=True)
@pytest.mark.parametrize("fault", _params(FAULTS))
async def test_fault_on_namespaces(cluster: FaultCluster, fault: Fault) -> None:
    await _run(cluster, fault)


@pytest.mark.skipif(NOT_ON_PROXY is not None, reason=str(NOT_ON_PROXY))
@pytest.mark.parametrize("cluster", ["proxy"], indirect=True)
@pytest.mark.parametrize("fault", _params(ON_PROXY))
async def test_fault_over_proxies(cluster: FaultCluster, fault: Fault) -> None:
    await _run(cluster, fault)
