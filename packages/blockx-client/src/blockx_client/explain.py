"""ExplainPlacement: every registered worker's eligibility, as a coordinator sees it.

``Client.explain_placement`` asks the block coordinator, or the bundle coordinator
for ``cluster=Cluster.BUNDLE`` (read-only: it reserves nothing and asks no
worker); ``blockx why`` prints the answer. Both services answer with
coordinator.v1's messages.
"""

from __future__ import annotations

from blockx_client._convert import placement_report_from_pb
from blockx_client.models import Cluster, PlacementReport
from blockx_client.transport import Transport
from blockx_proto import bundlecoordinator_v1, coordinator_v1


async def explain_placement(
    transport: Transport,
    addr: str,
    timeout_s: float,
    worker_addr: str | None = None,
    *,
    cluster: Cluster = Cluster.BLOCK,
) -> PlacementReport:
    channel = transport.channel(addr)
    request = coordinator_v1.ExplainPlacementRequest(worker_addr=worker_addr or "")
    if cluster is Cluster.BUNDLE:
        bundle = bundlecoordinator_v1.BundleCoordinatorServiceStub(channel)
        call = bundle.explain_placement(request, timeout=timeout_s)
    else:
        call = coordinator_v1.CoordinatorServiceStub(channel).explain_placement(
            request, timeout=timeout_s
        )
    reply = await transport.unary(addr, call)
    return placement_report_from_pb(addr, reply)
