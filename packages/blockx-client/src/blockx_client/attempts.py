"""Attempts of a task: the sans-IO book that judges them and the pump that runs them.

A task is run again under a NEW task_id (a Worker answers a task_id it has seen
with its retained result and never runs it twice): attempt ``n`` of the lineage
``original`` is ``<original>.retry-<n>`` (the first keeps ``original``).

``AttemptBook`` is the decision, with no clock and no randomness of its own: it
opens a lineage per key, judges each finished attempt (``Succeeded``,
``Retrying`` with the next attempt, or ``Failed`` for good) and says when the next
attempt is due: ``now_ms`` plus the ``blockx_core.backoff.Backoff`` wait for the
draw the caller passes. An attempt is worth running again when its result says
``retryable``, or when it was lost with its Worker (``WORKER_LOST``, or a state
other than SUCCEEDED/FAILED), up to ``max_attempts``.

``AttemptPump`` is the adapter: it runs attempts (each once it is due) at most
``in_flight`` at a time, hands back the finished ones in key order, and on close
cancels the attempts under way on their Workers before dropping their waits. The
book and the pump serve ``Client.run_with_retries`` and the drivers of
``blockx_drive`` (backfill and follow) alike.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Set
from types import TracebackType
from typing import Any, Final, Generic, TypeVar, assert_never

import msgspec
from msgspec.structs import replace

from blockx_client._outcomes import outcome_of_error
from blockx_client.models import Task, TaskResult, TaskState
from blockx_core.backoff import Backoff
from blockx_core.failures import ClientFailureCode

__all__ = [
    "RETRY_BACKOFF",
    "Attempt",
    "AttemptBook",
    "AttemptPump",
    "Failed",
    "Finished",
    "Judgement",
    "Retrying",
    "Succeeded",
    "Verdict",
    "attempt_task_id",
    "outcome_of_error",
    "verdict",
]

# The waits before attempt 2, 3, ...: a ceiling doubling from 0.5 s up to 5 s,
# long enough for a killed Worker to be restarted or dropped from the
# coordinator's view.
RETRY_BACKOFF: Final = Backoff(initial_s=0.5, max_s=5.0)

T = TypeVar("T")


class Verdict(enum.Enum):
    DONE = "done"
    RETRY = "retry"
    FAILED = "failed"


def verdict(result: TaskResult) -> Verdict:
    """DONE, worth another attempt (RETRY), or FAILED whatever the attempts left."""
    if result.ok:
        return Verdict.DONE
    lost = (
        result.state is not TaskState.FAILED or result.failure_code == ClientFailureCode.WORKER_LOST
    )
    return Verdict.RETRY if result.retryable or lost else Verdict.FAILED


def attempt_task_id(original_task_id: str, attempt: int) -> str:
    """The task_id of attempt number ``attempt`` of the lineage ``original_task_id``."""
    return original_task_id if attempt == 1 else f"{original_task_id}.retry-{attempt}"


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """Attempt ``number`` of the lineage ``original_task_id`` (opened under ``key``),
    to start no earlier than ``due_ms``."""

    key: int
    task: Task
    original_task_id: str
    number: int = 1
    due_ms: int = 0

    @property
    def task_id(self) -> str:
        return attempt_task_id(self.original_task_id, self.number)

    def as_task(self) -> Task:
        """``task`` under this attempt's task_id."""
        return replace(self.task, task_id=self.task_id)


class Succeeded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    attempt: Attempt
    result: TaskResult


class Retrying(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The attempt failed and the lineage goes on with ``next``."""

    attempt: Attempt
    result: TaskResult
    next: Attempt


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The lineage failed for good: not retryable, or out of attempts."""

    attempt: Attempt
    result: TaskResult


Judgement = Succeeded | Retrying | Failed


class AttemptBook:
    """The open lineages, one per key, and their current attempts."""

    def __init__(self, *, max_attempts: int, backoff: Backoff = RETRY_BACKOFF) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self._backoff = backoff
        self._current: dict[int, Attempt] = {}

    def open(self, key: int, task: Task, original_task_id: str, *, now_ms: int) -> Attempt:
        """The first attempt of a new lineage under ``key`` (due at once); a lineage
        already open under ``key`` is abandoned."""
        first = Attempt(key=key, task=task, original_task_id=original_task_id, due_ms=now_ms)
        self._current[key] = first
        return first

    def judge(self, attempt: Attempt, result: TaskResult, *, now_ms: int, draw: float) -> Judgement:
        """What ``result`` of ``attempt`` means for its lineage; the next attempt is due
        after the back-off for ``draw`` (in [0, 1)). A lineage ends with its
        Succeeded or Failed; judging an abandoned lineage's attempt leaves the book as
        it is."""
        judged: Judgement
        match verdict(result):
            case Verdict.DONE:
                judged = Succeeded(attempt=attempt, result=result)
            case Verdict.RETRY if attempt.number < self.max_attempts:
                wait_ms = round(self._backoff.delay(attempt.number, draw) * 1000)
                following = replace(attempt, number=attempt.number + 1, due_ms=now_ms + wait_ms)
                judged = Retrying(attempt=attempt, result=result, next=following)
            case Verdict.RETRY | Verdict.FAILED:
                judged = Failed(attempt=attempt, result=result)
            case unexpected:
                assert_never(unexpected)
        if self._current.get(attempt.key) == attempt:
            if isinstance(judged, Retrying):
                self._current[attempt.key] = judged.next
            else:
                del self._current[attempt.key]
        return judged

    def close(self, key: int) -> None:
        """Abandon the lineage under ``key``, if one is open."""
        self._current.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._current

    def __len__(self) -> int:
        return len(self._current)

    def current(self) -> Iterator[Attempt]:
        return iter(self._current.values())

    def next_deadline_ms(self) -> int | None:
        """When the earliest current attempt is due (None: no lineage open)."""
        return min((a.due_ms for a in self._current.values()), default=None)


class Finished(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """An attempt that ran, what it ran for (``item``) and its result; ``seconds``
    from its start to its end."""

    item: T
    attempt: Attempt
    result: TaskResult
    seconds: float


RunAttempt = Callable[[Task], Awaitable[TaskResult]]
CancelAttempts = Callable[[Iterable[str]], Awaitable[object]]


class AttemptPump(Generic[T]):
    """Runs the attempts of one ``book``: each after it is due, ``in_flight`` at most.

    ``run`` runs one task (its client errors already turned into results or raised,
    as the caller decides); ``cancel`` stops task_ids on their Workers, best effort
    (``Client.cancel_in_flight``; None: closing only drops the waits, as cancelling
    ``Client.run`` does). ``item`` travels with an attempt, for the caller."""

    def __init__(
        self,
        book: AttemptBook,
        *,
        run: RunAttempt,
        cancel: CancelAttempts | None = None,
        in_flight: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self.book = book
        self._run = run
        self._cancel = cancel
        self._in_flight = in_flight
        self._rng = rng or random.Random()
        self._running: dict[asyncio.Task[tuple[TaskResult, float]], tuple[T, Attempt]] = {}

    @staticmethod
    def now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    # ---- what runs -----------------------------------------------------------------

    @property
    def room(self) -> int:
        return self._in_flight - len(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def running(self) -> Iterator[tuple[T, Attempt]]:
        return iter(self._running.values())

    def running_keys(self) -> set[int]:
        return {attempt.key for _, attempt in self._running.values()}

    def open(self, key: int, task: Task, original_task_id: str) -> Attempt:
        return self.book.open(key, task, original_task_id, now_ms=self.now_ms())

    def judge(self, attempt: Attempt, result: TaskResult) -> Judgement:
        return self.book.judge(attempt, result, now_ms=self.now_ms(), draw=self._rng.random())

    def start(self, item: T, attempt: Attempt) -> None:
        """Run ``attempt`` once it is due (whether there is room is the caller's to ask)."""

        async def one() -> tuple[TaskResult, float]:
            wait_ms = attempt.due_ms - self.now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            started = time.monotonic()
            result = await self._run(attempt.as_task())
            return (
                replace(result, attempt=attempt.number, original_task_id=attempt.original_task_id),
                time.monotonic() - started,
            )

        self._running[asyncio.create_task(one())] = (item, attempt)

    async def wait(
        self, *, timeout_s: float | None = None, also: Set[asyncio.Future[Any]] = frozenset()
    ) -> list[Finished[T]]:
        """The attempts that finished by the first end (or ``timeout_s``, or one of
        ``also`` done), in key order. An attempt whose run raised raises here."""
        waiting: set[asyncio.Future[Any]] = {*self._running, *also}
        if not waiting:
            return []
        done, _ = await asyncio.wait(
            waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        finished = [task for task in self._running if task in done]
        finished.sort(key=lambda task: self._running[task][1].key)
        out: list[Finished[T]] = []
        for task in finished:
            if task.exception() is not None and out:
                break  # raised by the next wait, once the attempts before it are handed back
            item, attempt = self._running.pop(task)
            result, seconds = task.result()
            out.append(Finished(item=item, attempt=attempt, result=result, seconds=seconds))
        return out

    async def aclose(self) -> None:
        """Cancel the attempts under way on their Workers (with ``cancel``), then
        their waits."""
        if not self._running:
            return
        if self._cancel is not None:
            # Nobody will wait for these: stop them on their Workers first.
            await self._cancel(attempt.task_id for _, attempt in self._running.values())
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()

    async def __aenter__(self) -> AttemptPump[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
