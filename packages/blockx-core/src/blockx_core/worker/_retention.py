"""Terminal results kept for ``result_retention_ms``, within a byte budget.

Invariants, after every ``keep``:

* ``retained_bytes`` (the ``result_bytes`` of every kept result, expired or not
  yet purged included) is at most ``max_bytes``;
* a result dropped for the budget leaves a tombstone under its task id until the
  same end of retention: its state, failure code and retryability, its plugins'
  names and outcomes and the digest of the input that ran, but no outputs. A
  tombstone answers like a retained result, so a task id is never run twice while
  either is kept;
* at most ``max_tombstones`` tombstones; past that the oldest is forgotten early,
  as if its retention had ended.

The oldest results go first (the order they converged in); a result larger than
the whole budget becomes a tombstone at once, without pushing out the others.
Every entry's end of retention sits in one deadline heap; ``purge`` frees them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import msgspec

from blockx_core.deadlines import DeadlineHeap
from blockx_core.failures import FailureCode
from blockx_core.task import PluginResult, TaskInput, TaskResult, TaskState
from blockx_core.worker._types import RetentionStats, TaskSnapshot

# What a kept entry costs beyond its strings and bytes (the objects holding them).
ENTRY_OVERHEAD_BYTES: Final = 512
# What each kept call failure summary costs beyond its strings.
CALL_FAILURE_OVERHEAD_BYTES: Final = 96
# A tombstone keeps this much of the failure message.
TOMBSTONE_MESSAGE_CHARS: Final = 256


def result_bytes(task_id: str, slot_id: str, result: TaskResult) -> int:
    """What keeping ``result`` costs against RESULT_RETENTION_MAX_BYTES: its outputs,
    messages and names (UTF-8 lengths, counted as characters), plus a fixed overhead."""
    size = ENTRY_OVERHEAD_BYTES + len(task_id) + len(slot_id) + len(result.failure_message)
    for plugin in result.plugin_results:
        size += len(plugin.result) + len(plugin.plugin_name) + len(plugin.failure_message)
    for failure in result.call_failures:
        size += CALL_FAILURE_OVERHEAD_BYTES + len(failure.function) + len(failure.message)
    return size


def input_digest(task: TaskInput) -> str:
    """sha256 of what the task ran: its builder's and writer's names and configs."""
    digest = hashlib.sha256()
    handler = task.result_handler
    parts = (
        task.function_call_config.type,
        task.function_call_config.config,
        "" if handler is None else handler.type,
        "" if handler is None else handler.config,
    )
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


class _Kept:
    __slots__ = ("digest", "result", "size", "slot_id", "state")

    def __init__(
        self, state: TaskState, result: TaskResult, slot_id: str, digest: str, size: int
    ) -> None:
        self.state = state
        self.result = result
        self.slot_id = slot_id
        self.digest = digest
        self.size = size


class _Tombstone(msgspec.Struct, frozen=True, gc=False):
    """What is left of a result whose outputs were dropped."""

    state: TaskState
    slot_id: str
    success: bool
    failure_code: FailureCode | None
    retryable: bool
    failure_message: str
    plugins: tuple[tuple[str, bool, FailureCode | None], ...]
    digest: str


def _tombstone_of(kept: _Kept) -> _Tombstone:
    result = kept.result
    return _Tombstone(
        state=kept.state,
        slot_id=kept.slot_id,
        success=result.success,
        failure_code=result.failure_code,
        retryable=result.retryable,
        failure_message=result.failure_message[:TOMBSTONE_MESSAGE_CHARS],
        plugins=tuple((p.plugin_name, p.success, p.failure_code) for p in result.plugin_results),
        digest=kept.digest,
    )


class RetainedResults:
    """See the module docstring. A result is answered while ``now_ms`` is before its
    end of retention, even if the purge has not run yet."""

    def __init__(self, max_bytes: int, max_tombstones: int) -> None:
        self._max_bytes = max_bytes
        self._max_tombstones = max_tombstones
        # Both in the order the tasks converged: the first is the oldest.
        self._results: OrderedDict[str, _Kept] = OrderedDict()
        self._tombstones: OrderedDict[str, _Tombstone] = OrderedDict()
        self._until: DeadlineHeap[str] = DeadlineHeap()
        self._bytes = 0
        self._dropped = 0
        # Purged since the adapter last took them (take_purged), for its log.
        self._purged: list[str] = []

    def keep(
        self,
        task_id: str,
        state: TaskState,
        result: TaskResult,
        slot_id: str,
        digest: str,
        now_ms: int,
        until_ms: int,
    ) -> None:
        self.purge(now_ms)  # what is due frees its room before a live result is dropped
        self._forget(task_id)  # an expired, unpurged entry of an earlier run
        kept = _Kept(state, result, slot_id, digest, result_bytes(task_id, slot_id, result))
        self._until.set(task_id, until_ms)
        if kept.size > self._max_bytes:
            self._bury(task_id, kept)  # it would not fit even alone
            return
        while self._bytes + kept.size > self._max_bytes:
            oldest, dropped = self._results.popitem(last=False)
            self._bytes -= dropped.size
            self._bury(oldest, dropped)
        self._results[task_id] = kept
        self._bytes += kept.size

    def snapshot(self, task_id: str, now_ms: int) -> TaskSnapshot | None:
        """The terminal result of a task that ran here, or its tombstone, while kept."""
        until_ms = self._until.get(task_id)
        if until_ms is None or until_ms <= now_ms:
            return None
        kept = self._results.get(task_id)
        if kept is not None:
            return TaskSnapshot(
                task_id=task_id, slot_id=kept.slot_id, state=kept.state, result=kept.result
            )
        stone = self._tombstones[task_id]
        return TaskSnapshot(
            task_id=task_id,
            slot_id=stone.slot_id,
            state=stone.state,
            result=self._answer_of(stone),
            outputs_dropped=True,
        )

    def input_digest(self, task_id: str, now_ms: int) -> str | None:
        """The :func:`input_digest` of the task that ran as ``task_id``, while kept."""
        until_ms = self._until.get(task_id)
        if until_ms is None or until_ms <= now_ms:
            return None
        kept = self._results.get(task_id)
        return kept.digest if kept is not None else self._tombstones[task_id].digest

    def purge(self, now_ms: int) -> None:
        for task_id in self._until.pop_due(now_ms):
            self._forget(task_id)
            self._purged.append(task_id)

    def take_purged(self) -> Sequence[str]:
        if not self._purged:
            return ()
        purged, self._purged = self._purged, []
        return purged

    def next_purge_ms(self) -> int | None:
        return self._until.earliest_ms()

    def stats(self) -> RetentionStats:
        return RetentionStats(
            results=len(self._results),
            retained_bytes=self._bytes,
            tombstones=len(self._tombstones),
            dropped=self._dropped,
        )

    # ---- internals -------------------------------------------------------------------

    def _bury(self, task_id: str, kept: _Kept) -> None:
        self._tombstones[task_id] = _tombstone_of(kept)
        self._dropped += 1
        while len(self._tombstones) > self._max_tombstones:
            forgotten, _ = self._tombstones.popitem(last=False)
            self._until.cancel(forgotten)

    def _forget(self, task_id: str) -> None:
        kept = self._results.pop(task_id, None)
        if kept is not None:
            self._bytes -= kept.size
        self._tombstones.pop(task_id, None)
        self._until.cancel(task_id)

    def _answer_of(self, stone: _Tombstone) -> TaskResult:
        dropped = (
            "its outputs were dropped to keep retained results under "
            f"RESULT_RETENTION_MAX_BYTES ({self._max_bytes}); the input that ran has "
            f"sha256 {stone.digest}"
        )
        message = f"{stone.failure_message}; {dropped}" if stone.failure_message else dropped
        return TaskResult(
            success=stone.success,
            failure_code=stone.failure_code,
            retryable=stone.retryable,
            failure_message=message,
            plugin_results=tuple(
                PluginResult(plugin_name=name, success=success, failure_code=code)
                for name, success, code in stone.plugins
            ),
        )
