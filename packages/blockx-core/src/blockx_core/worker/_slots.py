"""The slot table: which slots are in use, their leases, and counts by state.

Cost follows activity, not capacity. Only slots in use (ALLOCATED or RUNNING)
exist as objects; a FREE slot is an index on a free list or above the
high-water mark ``_fresh`` (indexes never used yet), so a table of a million
slots costs nothing to create. Counts by state change with each transition, and
leases of ALLOCATED slots sit in a :class:`DeadlineHeap`, so heartbeats, timers
and admission never walk the table.

Allocation order: the most recently released slot first, else the lowest
never-used index.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from blockx_core.deadlines import DeadlineHeap
from blockx_core.worker._types import (
    Activate,
    Allocate,
    Converge,
    InvalidTransition,
    LeaseExpired,
    SlotEvent,
    SlotState,
)

_SLOT_TRANSITIONS: Final[Mapping[tuple[SlotState, type[SlotEvent]], SlotState]] = {
    (SlotState.FREE, Allocate): SlotState.ALLOCATED,
    (SlotState.ALLOCATED, Activate): SlotState.RUNNING,
    (SlotState.ALLOCATED, LeaseExpired): SlotState.FREE,
    # A task that fails while still PREPARING (activation failed) frees its slot.
    (SlotState.ALLOCATED, Converge): SlotState.FREE,
    (SlotState.RUNNING, Converge): SlotState.FREE,
}


class Slot:
    """A slot in use (FREE only while it is being allocated or after its release).
    ``lease_deadline_ms`` is 0 unless ALLOCATED."""

    __slots__ = ("index", "lease_deadline_ms", "slot_id", "state", "task_id")

    def __init__(
        self, index: int, slot_id: str = "", task_id: str = "", lease_deadline_ms: int = 0
    ) -> None:
        self.index = index
        self.state = SlotState.FREE
        self.slot_id = slot_id
        self.task_id = task_id
        self.lease_deadline_ms = lease_deadline_ms

    def apply(self, event: SlotEvent) -> None:
        """Move by the transition table; an illegal pair raises and changes nothing."""
        target = _SLOT_TRANSITIONS.get((self.state, type(event)))
        if target is None:
            raise InvalidTransition(
                f"slot {self.slot_id or self.index}: {type(event).__name__} in state "
                f"{self.state.value}"
            )
        self.state = target


class SlotTable:
    def __init__(self, task_slots: int, incarnation: str) -> None:
        self._capacity = task_slots
        self._incarnation = incarnation
        self._released: list[int] = []  # a stack of freed indexes
        self._fresh = 0  # indexes >= _fresh were never used
        self._by_id: dict[str, Slot] = {}
        self._by_task: dict[str, Slot] = {}
        self._counts = {SlotState.ALLOCATED: 0, SlotState.RUNNING: 0}
        self._leases: DeadlineHeap[str] = DeadlineHeap()  # slot_id -> lease end
        self._allocations = 0
        # The most slots in use at once since the last take_peak_in_use().
        self._peak_in_use = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def count(self, state: SlotState) -> int:
        if state is SlotState.FREE:
            return self._capacity - len(self._by_id)
        return self._counts[state]

    def by_id(self, slot_id: str) -> Slot | None:
        return self._by_id.get(slot_id)

    def by_task(self, task_id: str) -> Slot | None:
        return self._by_task.get(task_id)

    def has_free(self) -> bool:
        return len(self._by_id) < self._capacity

    @property
    def peak_in_use(self) -> int:
        """The most slots reserved or running at once since the last take."""
        return self._peak_in_use

    def take_peak_in_use(self) -> int:
        """``peak_in_use``, and start the next interval at the slots in use now."""
        peak, self._peak_in_use = self._peak_in_use, len(self._by_id)
        return peak

    def allocate(self, task_id: str, lease_deadline_ms: int) -> Slot:
        """Take a free slot for ``task_id`` under a lease (the caller checked has_free)."""
        if self._released:
            index = self._released.pop()
        elif self._fresh < self._capacity:
            index = self._fresh
            self._fresh += 1
        else:
            raise InvalidTransition("Allocate with no FREE slot")
        self._allocations += 1
        # The allocation counter makes a slot id unique even when the index is reused.
        slot_id = f"{self._incarnation}-{index}-{self._allocations}"
        slot = Slot(index, slot_id, task_id, lease_deadline_ms)
        self._apply(slot, Allocate())
        self._by_id[slot_id] = slot
        self._by_task[task_id] = slot
        self._leases.set(slot_id, lease_deadline_ms)
        self._peak_in_use = max(self._peak_in_use, len(self._by_id))
        return slot

    def activate(self, slot: Slot) -> None:
        """ALLOCATED → RUNNING: the lease no longer applies."""
        self._apply(slot, Activate())
        self._leases.cancel(slot.slot_id)
        slot.lease_deadline_ms = 0

    def release(self, slot: Slot, event: LeaseExpired | Converge) -> None:
        """Back to FREE (lease expired, or the task converged)."""
        self._apply(slot, event)
        self._leases.cancel(slot.slot_id)
        del self._by_id[slot.slot_id]
        del self._by_task[slot.task_id]
        self._released.append(slot.index)

    def expired_leases(self, now_ms: int) -> Iterator[Slot]:
        """ALLOCATED slots whose lease ended by ``now_ms``, earliest first. The caller
        releases each one (directly, or by converging its task)."""
        for slot_id in self._leases.pop_due(now_ms):
            yield self._by_id[slot_id]

    def next_lease_end_ms(self) -> int | None:
        return self._leases.earliest_ms()

    def states(self) -> list[SlotState]:
        """Every slot's state by index: O(task_slots), for tests and debugging only."""
        states = [SlotState.FREE] * self._capacity
        for slot in self._by_id.values():
            states[slot.index] = slot.state
        return states

    def _apply(self, slot: Slot, event: SlotEvent) -> None:
        # Every state change passes here, so the counts follow each transition.
        before = slot.state
        slot.apply(event)
        if before is not SlotState.FREE:
            self._counts[before] -= 1
        if slot.state is not SlotState.FREE:
            self._counts[slot.state] += 1
