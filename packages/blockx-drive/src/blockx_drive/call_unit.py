"""What one call of a driven task gets: a row, a block's rows, or a decoded event.

The drivers (``backfill``, ``follow``) pass the unit to their Builders as the
``unit`` key of the Builder config; ``event`` adds the registered ABI and the event's
name (``"abi"``, ``"event"``), and reads the logs table. The Worker decodes the logs
and checks that the ABI and the event exist (a task naming one that does not fails,
not retryable, naming what is registered); what can be told before any task goes
out is refused here.
"""

from __future__ import annotations

from typing import Any

from blockx_core.call_unit import EVENT_TABLE, CallUnit


def unit_config(unit: str, source_table: str, abi: str | None, event: str | None) -> dict[str, Any]:
    """The Builder config's keys for ``unit``; ValueError, one line, for a unit that
    does not exist, an event unit without ``abi`` and ``event`` or over another
    table, and ``abi`` or ``event`` with another unit."""
    try:
        chosen = CallUnit(unit)
    except ValueError:
        units = ", ".join(u.value for u in CallUnit)
        raise ValueError(f"unit must be one of {units}, got {unit!r}") from None
    if chosen is not CallUnit.EVENT:
        if abi is not None or event is not None:
            raise ValueError(
                f"abi and event go with the event unit (unit 'event'), not unit {unit!r}"
            )
        return {"unit": chosen.value}
    if not abi or not event:
        raise ValueError(
            "the event unit needs abi (a registered ABI's name, see `blockx chain abi "
            "list`) and event (an event's name in it)"
        )
    if source_table != EVENT_TABLE:
        raise ValueError(f"the event unit reads the {EVENT_TABLE} table, not {source_table!r}")
    return {"unit": chosen.value, "abi": abi, "event": event}
