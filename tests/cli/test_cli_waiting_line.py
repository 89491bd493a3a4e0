"""The CLI's "waiting for a slot" line: one line per reason, not one per back-off."""

from __future__ import annotations

import io

from grpclib.const import Status
from rich.console import Console

from blockx_cli.waiting import WaitingLine
from blockx_client import NoSlotError, SlotWait, UnavailableError
from blockx_core.coordinator import PlacementExplanation, ReasonKind, WorkerReason

FULL = PlacementExplanation(
    workers=(WorkerReason(worker_addr="w:1", kind=ReasonKind.FULL, used_slots=2, task_slots=2),)
)


def test_one_line_per_reason() -> None:
    out = io.StringIO()
    line = WaitingLine(Console(file=out, width=200))
    busy = NoSlotError("RESOURCE_EXHAUSTED: no slot", Status.RESOURCE_EXHAUSTED, placement=FULL)
    for attempt in (1, 2, 3):
        line.waiting(SlotWait("t", attempt, 0.1, busy))
    line.waiting(SlotWait("t", 1, 0.1, UnavailableError("UNAVAILABLE: not ready")))
    line.done()
    line.waiting(SlotWait("t", 1, 0.1, busy))
    assert out.getvalue().splitlines() == [
        "waiting for a slot: w:1: full 2/2",
        "waiting for a slot: UNAVAILABLE: not ready",
        "waiting for a slot: w:1: full 2/2",
    ]
