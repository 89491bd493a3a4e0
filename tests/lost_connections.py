"""A channel whose connection is lost under a call, for the code that must take
grpclib's failure then (an AttributeError from inside grpclib) as a lost connection."""

from __future__ import annotations

from grpclib.protocol import H2Protocol

from blockx_proto.channel import Channel


class ClosedUnderTheCall(Channel):
    """Loses its connection after handing it to a call, before the request is sent:
    as when the call waited for room to send (a full write buffer, the peer's limit
    of streams) and the connection went meanwhile."""

    async def __connect__(self) -> H2Protocol:
        protocol = await super().__connect__()
        protocol.connection_lost(None)  # what asyncio reports
        return protocol
