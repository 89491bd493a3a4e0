"""ExplainPlacement: every registered worker's eligibility, as a coordinator sees it.

``Client.explain_placement`` asks the block coordinator (read-only: it reserves
nothing and asks no worker); ``blockx why`` prints the answer.
"""

from __future__ import annotations

from blockx_client._convert import placement_report_from_pb
from blockx_client.models import PlacementReport
from blockx_client.transport import Transport
from blockx_proto import coordinator_v1


async def explain_placement(
    transport: Transport, addr: str, timeout_s: float, worker_addr: str | None = None
) -> PlacementReport:
    stub = coordinator_v1.CoordinatorServiceStub(transport.channel(addr))
    request = coordinator_v1.ExplainPlacementRequest(worker_addr=worker_addr or "")
    reply = await transport.unary(addr, stub.explain_placement(request, timeout=timeout_s))
    return placement_report_from_pb(addr, reply)
