"""Where the dashboard reads from and how it serves: ``DashboardConfig``.

The dashboard only reads: the registry from etcd, task lists and results from the
Workers, placement from the Coordinators, the backfill and follow jobs' records
from the sink database.
"""

from __future__ import annotations

from typing import Final

import msgspec

from blockx_client import EtcdAccess
from blockx_core.registry import DEFAULT_REGISTRY_PREFIXES

# Loopback unless configured: the dashboard shows task ids, failure messages and
# addresses, and has no login of its own.
DEFAULT_HOST: Final = "127.0.0.1"
# A port no common tool claims (Ray's dashboard is 8265, Flower 5555, Dask 8787,
# Temporal's UI 8233, Prometheus 9090, node_exporter 9100).
DEFAULT_PORT: Final = 8941
DEFAULT_REFRESH_S: Final = 5.0
DEFAULT_TIMEOUT_S: Final = 3.0


class DashboardConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``coordinator``, ``bundle_coordinator`` and ``proxy_socket``: None is the
    client's own default (the environment, then the running ``dev up``, then
    localhost); ``direct``: through no proxy. ``sink_db_url``: the sink whose job
    records the jobs page shows (None: none was named); ``blockdb_url``: the block
    database whose state (head, and whole blocks or the logs of a filter) it shows
    above them. ``timeout_s`` bounds each
    answer a page waits for (etcd, each Worker, the Coordinator, the sink)."""

    etcd_endpoints: tuple[str, ...]
    prefixes: tuple[str, ...] = DEFAULT_REGISTRY_PREFIXES
    sink_db_url: str | None = None
    blockdb_url: str | None = None
    coordinator: str | None = None
    bundle_coordinator: str | None = None
    proxy_socket: str | None = None
    direct: bool = False
    access: EtcdAccess | None = None
    refresh_s: float = DEFAULT_REFRESH_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Host names a request may address (its Host header, port aside); empty: any.
    # On loopback only loopback names, so a web page whose domain an attacker
    # re-points at 127.0.0.1 (DNS rebinding) cannot read the dashboard.
    allowed_hosts: tuple[str, ...] = ()


LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1")
