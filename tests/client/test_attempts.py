"""The attempt book (every kind of result against a lineage with attempts left and
without) and the pump that runs the attempts (bounded, in key order, cancelled on
close), with a scripted ``run`` instead of a cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from blockx_client import Task, TaskResult, TaskState
from blockx_client.attempts import (
    RETRY_BACKOFF,
    Attempt,
    AttemptBook,
    AttemptPump,
    Failed,
    Judgement,
    Retrying,
    Succeeded,
    attempt_task_id,
)
from blockx_core.failures import ClientFailureCode, FailureCode

TASK = Task.call_list("f", [[1]], task_id="t")


def result(
    state: TaskState,
    *,
    retryable: bool = False,
    code: FailureCode | ClientFailureCode | None = None,
) -> TaskResult:
    return TaskResult(task_id="t", state=state, retryable=retryable, failure_code=code)


SUCCEEDED = result(TaskState.SUCCEEDED)
RETRYABLE = result(TaskState.FAILED, retryable=True, code=FailureCode.PLUGIN_FAILED)
FINAL = result(TaskState.FAILED, code=FailureCode.BUILDER_FAILED)
NOT_FOUND = result(TaskState.NOT_FOUND)
LOST = result(TaskState.FAILED, code=ClientFailureCode.WORKER_LOST)
CANCELLED = result(TaskState.FAILED, code=FailureCode.CANCELLED)

# (the result, attempts left after it?) -> the judgement
JUDGEMENTS: list[tuple[TaskResult, bool, type[Judgement]]] = [
    (SUCCEEDED, True, Succeeded),
    (SUCCEEDED, False, Succeeded),
    (RETRYABLE, True, Retrying),
    (RETRYABLE, False, Failed),
    (FINAL, True, Failed),
    (FINAL, False, Failed),
    (NOT_FOUND, True, Retrying),
    (NOT_FOUND, False, Failed),
    (LOST, True, Retrying),
    (LOST, False, Failed),
    (CANCELLED, True, Failed),
    (CANCELLED, False, Failed),
]


@pytest.mark.parametrize(("outcome", "left", "expected"), JUDGEMENTS)
def test_every_result_with_and_without_attempts_left(
    outcome: TaskResult, left: bool, expected: type[Judgement]
) -> None:
    book = AttemptBook(max_attempts=3)
    attempt = book.open(7, TASK, "t", now_ms=100)
    if not left:
        for _ in range(2):
            judged = book.judge(attempt, RETRYABLE, now_ms=100, draw=0.0)
            assert isinstance(judged, Retrying)
            attempt = judged.next
    judged = book.judge(attempt, outcome, now_ms=1_000, draw=0.0)
    assert type(judged) is expected
    assert (judged.attempt, judged.result) == (attempt, outcome)
    if isinstance(judged, Retrying):
        # The same lineage, one attempt further, due after the back-off.
        assert judged.next.original_task_id == "t"
        assert judged.next.number == attempt.number + 1
        assert judged.next.due_ms == 1_000 + round(RETRY_BACKOFF.delay(attempt.number, 0.0) * 1000)
        assert list(book.current()) == [judged.next]
    else:
        assert 7 not in book
        assert book.next_deadline_ms() is None


def test_a_lineage_names_its_attempts() -> None:
    book = AttemptBook(max_attempts=5)
    attempt = book.open(0, TASK, "job-1-0", now_ms=0)
    ids = [attempt.as_task().task_id]
    for _ in range(3):
        judged = book.judge(attempt, LOST, now_ms=0, draw=0.5)
        assert isinstance(judged, Retrying)
        attempt = judged.next
        ids.append(attempt.as_task().task_id)
    assert ids == ["job-1-0", "job-1-0.retry-2", "job-1-0.retry-3", "job-1-0.retry-4"]
    assert ids == [attempt_task_id("job-1-0", n) for n in range(1, 5)]


@pytest.mark.parametrize(("draw", "waits_ms"), [(0.0, [250, 500, 1000]), (1.0, [500, 1000, 2000])])
def test_the_next_attempt_waits_the_back_off_for_the_draw(draw: float, waits_ms: list[int]) -> None:
    book = AttemptBook(max_attempts=4)
    attempt = book.open(0, TASK, "t", now_ms=10)
    assert (attempt.due_ms, book.next_deadline_ms()) == (10, 10)
    now, seen = 10, []
    for _ in range(3):
        judged = book.judge(attempt, RETRYABLE, now_ms=now, draw=draw)
        assert isinstance(judged, Retrying)
        attempt = judged.next
        seen.append(attempt.due_ms - now)
        assert book.next_deadline_ms() == attempt.due_ms
        now = attempt.due_ms + 5
    assert seen == waits_ms


def test_the_earliest_lineage_gives_the_next_deadline() -> None:
    book = AttemptBook(max_attempts=4)
    first = book.open(1, TASK, "a", now_ms=0)
    book.open(2, TASK, "b", now_ms=50)
    judged = book.judge(first, RETRYABLE, now_ms=0, draw=0.0)
    assert isinstance(judged, Retrying)
    assert book.next_deadline_ms() == 50
    book.close(2)
    assert book.next_deadline_ms() == judged.next.due_ms
    assert len(book) == 1


def test_judging_an_abandoned_lineage_leaves_the_book_as_it_is() -> None:
    book = AttemptBook(max_attempts=4)
    old = book.open(3, TASK, "old", now_ms=0)
    new = book.open(3, TASK, "new", now_ms=0)  # the block is on another hash now
    assert isinstance(book.judge(old, RETRYABLE, now_ms=0, draw=0.0), Retrying)
    assert isinstance(book.judge(old, SUCCEEDED, now_ms=0, draw=0.0), Succeeded)
    assert list(book.current()) == [new]


def test_a_book_takes_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        AttemptBook(max_attempts=0)


class Script:
    """A ``run`` whose tasks end when the test says, and a record of cancellations."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ends: dict[str, asyncio.Future[TaskResult]] = {}
        self.cancelled: list[list[str]] = []
        self._more = asyncio.Event()

    async def run(self, task: Task) -> TaskResult:
        self.started.append(task.task_id)
        self._more.set()
        end = self.ends.setdefault(task.task_id, asyncio.get_running_loop().create_future())
        return await end

    def end(self, task_id: str, outcome: TaskResult | Exception) -> None:
        end = self.ends.setdefault(task_id, asyncio.get_running_loop().create_future())
        if isinstance(outcome, Exception):
            end.set_exception(outcome)
        else:
            end.set_result(outcome)

    async def cancel(self, task_ids: Iterable[str]) -> None:
        self.cancelled.append(sorted(task_ids))

    async def wait_started(self, count: int) -> None:
        while len(self.started) < count:
            self._more.clear()
            await self._more.wait()


async def test_the_pump_hands_back_finished_attempts_in_key_order_with_their_lineage() -> None:
    script = Script()
    pump = AttemptPump[str](
        AttemptBook(max_attempts=2), run=script.run, cancel=script.cancel, in_flight=3
    )
    for key in (3, 1, 2):
        pump.start(f"item-{key}", pump.open(key, TASK, f"t{key}"))
    assert (len(pump), pump.room, pump.running_keys()) == (3, 0, {1, 2, 3})
    await script.wait_started(3)
    script.end("t3", SUCCEEDED)
    script.end("t1", RETRYABLE)
    await asyncio.sleep(0)
    finished = await pump.wait()
    assert [(f.item, f.attempt.key) for f in finished] == [("item-1", 1), ("item-3", 3)]
    assert [(f.result.attempt, f.result.original_task_id) for f in finished] == [
        (1, "t1"),
        (1, "t3"),
    ]
    assert (len(pump), pump.room) == (1, 2)
    await pump.aclose()
    assert script.cancelled == [["t2"]]
    assert len(pump) == 0


async def test_the_pump_starts_an_attempt_once_it_is_due() -> None:
    script = Script()
    pump = AttemptPump[None](AttemptBook(max_attempts=2), run=script.run, cancel=script.cancel)
    later = Attempt(key=0, task=TASK, original_task_id="t", number=2, due_ms=pump.now_ms() + 60_000)
    pump.start(None, later)
    for _ in range(5):
        await asyncio.sleep(0)
    assert script.started == []  # still waiting for its due time
    await pump.aclose()
    assert script.cancelled == [["t.retry-2"]]


async def test_a_run_that_raises_is_raised_after_the_attempts_before_it() -> None:
    script = Script()
    pump = AttemptPump[int](
        AttemptBook(max_attempts=1), run=script.run, cancel=script.cancel, in_flight=2
    )
    pump.start(1, pump.open(1, TASK, "a"))
    pump.start(2, pump.open(2, TASK, "b"))
    await script.wait_started(2)
    script.end("a", SUCCEEDED)
    script.end("b", ValueError("refused"))
    await asyncio.sleep(0)
    assert [f.item for f in await pump.wait()] == [1]
    with pytest.raises(ValueError, match="refused"):
        await pump.wait()


async def test_the_pump_waits_for_another_future_or_a_timeout() -> None:
    script = Script()
    async with AttemptPump[None](
        AttemptBook(max_attempts=1), run=script.run, cancel=script.cancel
    ) as pump:
        pump.start(None, pump.open(0, TASK, "t"))
        stop = asyncio.get_running_loop().create_future()
        stop.set_result(True)
        assert await pump.wait(also={stop}) == []
        assert await pump.wait(timeout_s=0) == []
    assert script.cancelled == [["t"]]


async def test_without_cancel_closing_only_drops_the_waits() -> None:
    script = Script()
    pump = AttemptPump[None](AttemptBook(max_attempts=1), run=script.run)
    pump.start(None, pump.open(0, TASK, "t"))
    await script.wait_started(1)
    await pump.aclose()
    assert (len(pump), script.cancelled) == (0, [])
    assert script.ends["t"].cancelled()
