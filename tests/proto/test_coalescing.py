"""CoalescingTransport: the writes of one event-loop iteration reach the socket as
one write, in order, and nothing written is lost on close."""

from __future__ import annotations

import asyncio

from blockx_proto.coalescing import MAX_PENDING_BYTES, CoalescingTransport


class Recording(asyncio.Transport):
    """The wrapped transport: records each write it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


async def next_iteration() -> None:
    await asyncio.sleep(0)


async def test_writes_of_one_iteration_leave_together_in_order() -> None:
    inner = Recording()
    transport = CoalescingTransport(inner)
    for frame in (b"headers", b"", b"data", b"trailers"):
        transport.write(frame)
    assert inner.writes == []
    assert transport.get_write_buffer_size() == len(b"headersdatatrailers")
    await next_iteration()
    assert inner.writes == [b"headersdatatrailers"]
    transport.write(b"next")
    await next_iteration()
    assert inner.writes == [b"headersdatatrailers", b"next"]
    assert transport.get_write_buffer_size() == 0


async def test_close_sends_what_is_pending_first_and_abort_drops_it() -> None:
    inner = Recording()
    transport = CoalescingTransport(inner)
    transport.write(b"goaway")
    transport.close()
    assert (inner.writes, inner.closed) == ([b"goaway"], True)
    await next_iteration()  # the scheduled send finds nothing more
    assert inner.writes == [b"goaway"]

    inner = Recording()
    transport = CoalescingTransport(inner)
    transport.write(b"lost")
    transport.abort()
    await next_iteration()
    assert (inner.writes, inner.aborted) == ([], True)


async def test_nothing_is_written_to_a_closing_transport() -> None:
    inner = Recording()
    transport = CoalescingTransport(inner)
    transport.write(b"late")
    inner.closed = True  # the peer went away meanwhile
    await next_iteration()
    assert inner.writes == []


async def test_a_writer_that_never_yields_reaches_the_socket_as_it_goes() -> None:
    inner = Recording()
    transport = CoalescingTransport(inner)
    frame = b"x" * 16_384
    for _ in range(10):
        transport.write(frame)
    assert sum(map(len, inner.writes)) >= 8 * len(frame)
    assert transport.get_write_buffer_size() < MAX_PENDING_BYTES
    await next_iteration()
    assert b"".join(inner.writes) == frame * 10
