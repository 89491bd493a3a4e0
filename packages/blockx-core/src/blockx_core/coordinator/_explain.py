"""Placement explanations: why each Worker was, or was not, given a task.

A ``WorkerReason`` is one Worker's eligibility as the Coordinator sees it at
``now_ms``: the filter that rules it out (with the figures behind it), or what it
answered when it was asked. ``worker_reason`` derives it from the view with the
same filters, in the same order, as ``CoordinatorCore.select_candidate``;
``describe_reason`` is the one place that turns a reason into words.

A failed ReserveWorkerSlot carries a ``PlacementExplanation`` in its trailing
metadata (``PLACEMENT_METADATA_KEY``, msgspec JSON). ``fit_explanation`` keeps
that value within ``PLACEMENT_MAX_BYTES`` by leaving Workers out from the end and
counting them in ``omitted``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final, assert_never

import msgspec

from blockx_core.coordinator._config import CoordinatorConfig
from blockx_core.coordinator._view import WorkerView
from blockx_core.errors import ErrorCode

# gRPC trailing metadata key (binary: the value is base64 on the wire).
PLACEMENT_METADATA_KEY: Final = "blockx-placement-bin"
# The raw value's bound: its base64 form (what travels) is then at most 8 KiB.
PLACEMENT_MAX_BYTES: Final = 6 * 1024
# A Worker's own words are cut here, so that one chatty Worker cannot crowd out the rest.
MAX_DETAIL_CHARS: Final = 160


class ReasonKind(enum.StrEnum):
    """Why a Worker is or is not a candidate. The filters come in the order the
    Coordinator applies them; the last four are what a reservation met."""

    ELIGIBLE = "eligible"
    STALE_HEARTBEAT = "stale_heartbeat"
    CPU_RED_LINE = "cpu_red_line"
    MEMORY_RED_LINE = "memory_red_line"
    ERROR_RATE_RED_LINE = "error_rate_red_line"
    BREAKER_OPEN = "breaker_open"
    FULL = "full"
    # Eligible, but the reservation ended before reaching it (``max_candidates``).
    NOT_TRIED = "not_tried"
    # Asked for a slot: a definite answer, no connection, or no answer to be sure of.
    ANSWERED = "answered"
    UNREACHABLE = "unreachable"
    UNCERTAIN = "uncertain"


class WorkerReason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One Worker's eligibility and the figures behind it; unset figures are 0."""

    worker_addr: str
    kind: ReasonKind
    # STALE_HEARTBEAT: the heartbeat's age on the Coordinator's clock, and the timeout.
    heartbeat_age_ms: int = 0
    heartbeat_timeout_ms: int = 0
    # *_RED_LINE: the fraction the Worker reported, and the line it is above.
    measured: float = 0.0
    red_line: float = 0.0
    # BREAKER_OPEN: how long until the breaker closes.
    breaker_remaining_ms: int = 0
    # ELIGIBLE / FULL / NOT_TRIED: slots in use (reserved + running) and slots.
    used_slots: int = 0
    task_slots: int = 0
    # ANSWERED / UNREACHABLE / UNCERTAIN: the answer's code, the tries, its words.
    code: ErrorCode | None = None
    attempts: int = 0
    detail: str = ""


class PlacementExplanation(msgspec.Struct, frozen=True, kw_only=True):
    """The Workers a placement considered; ``omitted`` more were left out for size."""

    workers: tuple[WorkerReason, ...] = ()
    omitted: int = 0


class InvalidExplanation(ValueError):
    """A metadata value that is not a PlacementExplanation."""


def worker_reason(view: WorkerView, config: CoordinatorConfig, now_ms: int) -> WorkerReason:
    """The first filter that rules ``view`` out at ``now_ms``, or ELIGIBLE."""
    hb = view.heartbeat
    addr = hb.worker_addr
    age_ms = now_ms - hb.last_heartbeat_ms
    if age_ms > config.heartbeat_timeout_ms:
        return WorkerReason(
            worker_addr=addr,
            kind=ReasonKind.STALE_HEARTBEAT,
            heartbeat_age_ms=age_ms,
            heartbeat_timeout_ms=config.heartbeat_timeout_ms,
        )
    for kind, measured, line in (
        (ReasonKind.CPU_RED_LINE, hb.cpu_percent, config.cpu_red_line),
        (ReasonKind.MEMORY_RED_LINE, hb.memory_percent, config.memory_red_line),
        (ReasonKind.ERROR_RATE_RED_LINE, hb.error_rate, config.error_rate_red_line),
    ):
        if measured > line:
            return WorkerReason(worker_addr=addr, kind=kind, measured=measured, red_line=line)
    if view.breaker_open(now_ms):
        return WorkerReason(
            worker_addr=addr,
            kind=ReasonKind.BREAKER_OPEN,
            breaker_remaining_ms=view.circuit_breaker_deadline_ms - now_ms,
        )
    kind = ReasonKind.FULL if hb.free_capacity <= 0 else ReasonKind.ELIGIBLE
    return WorkerReason(
        worker_addr=addr, kind=kind, used_slots=hb.used_total, task_slots=hb.task_slots
    )


def answer_reason(
    worker_addr: str, kind: ReasonKind, code: ErrorCode, detail: str, attempts: int
) -> WorkerReason:
    """What a Worker that was asked for a slot answered (ANSWERED, UNREACHABLE, UNCERTAIN)."""
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 1] + "…"
    return WorkerReason(
        worker_addr=worker_addr, kind=kind, code=code, attempts=attempts, detail=detail
    )


def describe_reason(reason: WorkerReason) -> str:
    """The reason in words, e.g. ``cpu 0.97 > red line 0.90`` or ``full 50/50``."""
    r = reason
    match r.kind:
        case ReasonKind.ELIGIBLE:
            return f"eligible {r.used_slots}/{r.task_slots}"
        case ReasonKind.STALE_HEARTBEAT:
            return (
                f"stale heartbeat {r.heartbeat_age_ms / 1000:.1f} s "
                f"(timeout {r.heartbeat_timeout_ms / 1000:g} s)"
            )
        case ReasonKind.CPU_RED_LINE:
            return f"cpu {r.measured:.2f} > red line {r.red_line:.2f}"
        case ReasonKind.MEMORY_RED_LINE:
            return f"memory {r.measured:.2f} > red line {r.red_line:.2f}"
        case ReasonKind.ERROR_RATE_RED_LINE:
            return f"error rate {r.measured:.2f} > red line {r.red_line:.2f}"
        case ReasonKind.BREAKER_OPEN:
            return f"breaker open for {r.breaker_remaining_ms / 1000:.1f} s"
        case ReasonKind.FULL:
            return f"full {r.used_slots}/{r.task_slots}"
        case ReasonKind.NOT_TRIED:
            return f"not tried (eligible {r.used_slots}/{r.task_slots})"
        case ReasonKind.ANSWERED:
            return f"answered {r.detail or r.code}"
        case ReasonKind.UNREACHABLE:
            return f"unreachable: {r.detail or r.code}"
        case ReasonKind.UNCERTAIN:
            return f"uncertain after {r.attempts} tries ({r.detail or r.code})"
        case _ as unreachable:
            assert_never(unreachable)


def describe_explanation(explanation: PlacementExplanation, *, limit: int | None = None) -> str:
    """``addr: reason; addr: reason (+N more)``: the first ``limit`` Workers in words."""
    shown = explanation.workers if limit is None else explanation.workers[:limit]
    more = explanation.omitted + len(explanation.workers) - len(shown)
    text = "; ".join(f"{r.worker_addr}: {describe_reason(r)}" for r in shown)
    if more:
        text += f" (+{more} more worker{'s' if more != 1 else ''})"
    return text or "no worker registered"


def every_worker_full(explanation: PlacementExplanation) -> bool:
    """Every Worker listed is full or answered NoSlot, and none was left out: busy."""
    return (
        bool(explanation.workers)
        and explanation.omitted == 0
        and all(
            r.kind is ReasonKind.FULL
            or (r.kind is ReasonKind.ANSWERED and r.code is ErrorCode.NO_SLOT)
            for r in explanation.workers
        )
    )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(PlacementExplanation)


def fit_explanation(
    reasons: Iterable[WorkerReason], total: int, max_bytes: int = PLACEMENT_MAX_BYTES
) -> PlacementExplanation:
    """The leading ``reasons`` whose encoding fits ``max_bytes``; ``omitted`` counts
    the rest of ``total``. Stops reading ``reasons`` at the first one that does not fit."""
    size = len(_encoder.encode(PlacementExplanation(omitted=total)))
    kept: list[WorkerReason] = []
    for reason in reasons:
        grows = len(_encoder.encode(reason)) + (1 if kept else 0)
        if size + grows > max_bytes:
            break
        kept.append(reason)
        size += grows
    return PlacementExplanation(workers=tuple(kept), omitted=total - len(kept))


def encode_explanation(explanation: PlacementExplanation) -> bytes:
    return _encoder.encode(explanation)


def decode_explanation(raw: bytes | str) -> PlacementExplanation:
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidExplanation(str(exc)) from None
