"""ChainFinality: the block database's chain row as the IO subsystem's finality view."""

from __future__ import annotations

import asyncio

import pytest
from support import wait_until

from blockx_chain.schema import ChainState
from blockx_core.failures import IoErrorKind
from blockx_server.io.errors import BackendError
from blockx_server.io.finality import ChainFinality


class Source:
    """Answers queued chain rows, or raises what is queued."""

    def __init__(self, *answers: ChainState | BaseException | None) -> None:
        self.answers = list(answers)

    async def chain(self) -> ChainState | None:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def state(finalized: int | None, epoch: int) -> ChainState:
    return ChainState(
        chain_id=31337,
        genesis_hash="0x" + "00" * 32,
        head_number=100,
        head_hash="0x" + "11" * 32,
        finalized_number=finalized,
        epoch=epoch,
    )


async def test_it_follows_the_chain_row_and_keeps_the_last_values_on_failures() -> None:
    source = Source(
        None,
        state(88, 0),
        BackendError(IoErrorKind.UNAVAILABLE, "database down"),
        RuntimeError("a bug in the store"),
        state(12, 1),
    )
    view = ChainFinality(source, refresh_ms=1000)
    seen = []
    for _ in range(5):
        await view.refresh()
        seen.append((view.finalized, view.epoch))
    assert seen == [(None, 0), (88, 0), (88, 0), (88, 0), (12, 1)]


@pytest.mark.parametrize("refresh_ms", [1, 50])
async def test_run_keeps_refreshing(refresh_ms: int) -> None:
    source = Source(*(state(n, 0) for n in range(1, 100)))
    view = ChainFinality(source, refresh_ms=refresh_ms)
    task = asyncio.create_task(view.run())
    try:
        await wait_until(lambda: (view.finalized or 0) >= 3, "three refreshes")
    finally:
        task.cancel()
    assert view.finalized is not None
    assert view.finalized >= 3
