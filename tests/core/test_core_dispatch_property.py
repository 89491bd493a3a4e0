"""Property tests for DispatcherCore: water-filling, root calls fed in chunks against
the same roots fed at once, and random interleavings of every event against a model
built from the commands the core emits.

The model knows only what an adapter would know: which executor holds which call
(from ``SendCalls``, ``CancelCalls``, ``KillExecutor`` and the events it fed in), how
often each call was sent, the heartbeats it reported and the spec's rules (window,
retry policy, fastFail, output limit). From that it predicts each step's kills,
cancellations, resumes, convergences and (re)sends, and checks the invariants:

* a task converges at most once; a successful convergence has one output per root,
  in root order;
* a call id is never held by two executors at once (a ``SendCalls`` only names calls
  that no executor holds) and every ``CancelCalls`` names calls that executor holds;
* per task, root calls in flight never exceed the window nor
  ``task_max_inflight_calls``;
* a ``ResumeWithResult`` always targets the executor that holds the parent;
* a retried call is never sent before its back-off has passed;
* at the end, with executors up and every call answered, every task has ended and
  the core holds no call.

Any held call may complete, even a parent with sub-calls pending (its sub-calls are
then cancelled), and sub-calls use the roots' function name under another code as
well as their own, so batches must keep calls of different code apart.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, assert_never

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockx_core.calls import CallContext, RootCall
from blockx_core.dispatch import (
    CallRetryPolicy,
    CallsConverged,
    CallsFailed,
    CancelCalls,
    ConvergeTaskCalls,
    DispatchCommand,
    DispatchConfig,
    DispatcherCore,
    KillExecutor,
    ResumeWithResult,
    SendCalls,
    SubCallFailed,
    SubCallReturned,
)
from blockx_core.errors import BlockxUsageError
from blockx_core.failures import CallFailureKind, FailureCode

# ---- root calls in chunks ---------------------------------------------------------------


def chunk_root(i: int) -> RootCall | list[Any]:
    """Root ``i``: a mix of the shorthand, keyword arguments and contexts."""
    if i % 3 == 0:
        return [i]
    context = CallContext(block_number=i, block_hash=f"0x{i:x}") if i % 2 else None
    return RootCall([i], {"k": i} if i % 5 else {}, context)


def drive_chunks(
    cfg: DispatchConfig, chunks: list[list[RootCall | list[Any]]], data: st.DataObject
) -> CallsConverged:
    """Feed the chunks, completing a random share of the held calls (in random order)
    between chunks, then say done and complete the rest; return the convergence."""
    core = DispatcherCore(cfg)
    for ex in ("e1", "e2"):
        core.executor_up(ex, 0)
    held: dict[int, tuple[str, list[Any]]] = {}
    converged: list[CallsConverged] = []

    def absorb(cmds: list[DispatchCommand]) -> None:
        for c in cmds:
            if isinstance(c, SendCalls):
                for cid, args in zip(c.call_ids, c.args, strict=True):
                    held[cid] = (c.executor_id, args)
            elif isinstance(c, CallsConverged):
                converged.append(c)
            else:
                assert not isinstance(c, CallsFailed), c

    def complete(how_many: int) -> None:
        for _ in range(min(how_many, len(held))):
            cid = data.draw(st.sampled_from(sorted(held)))
            ex, args = held.pop(cid)
            absorb(core.calls_completed(ex, [cid], [f'"v{args[0]}"'.encode()], 0))

    absorb(core.open_task("t", "code@1", "f", 0))
    for chunk in chunks:
        absorb(core.add_roots("t", chunk, 0))
        complete(data.draw(st.integers(0, len(held))))
        assert converged == []
    absorb(core.roots_done("t", 0))
    while held:
        complete(1)
    assert len(converged) == 1
    return converged[0]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), window=st.integers(1, 8), data=st.data())
def test_roots_in_chunks_give_the_outputs_of_roots_at_once(
    n: int, window: int, data: st.DataObject
) -> None:
    cfg = DispatchConfig(initial_window=window, task_max_inflight_calls=16, max_batch_calls=3)
    roots = [chunk_root(i) for i in range(n)]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=8)))
    chunks = [roots[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, n], strict=True)]
    at_once = drive_chunks(cfg, [roots], data)
    in_chunks = drive_chunks(cfg, chunks, data)
    assert in_chunks == at_once
    assert [o.index for o in at_once.outputs] == list(range(n))
    assert [o.value_json for o in at_once.outputs] == [f'"v{i}"'.encode() for i in range(n)]
    assert [o.context for o in at_once.outputs] == [
        None if isinstance(r, list) else r.context for r in roots
    ]


# ---- water-filling -----------------------------------------------------------------------


def greedy_fill(loads: list[int], n: int) -> list[int]:
    """Reference: hand the calls out one by one, each to a least-loaded executor."""
    final = list(loads)
    for _ in range(n):
        final[final.index(min(final))] += 1
    return sorted(final)


@settings(max_examples=300, deadline=None)
@given(
    loads=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=6),
    n=st.integers(min_value=1, max_value=60),
    max_batch=st.integers(min_value=1, max_value=8),
)
def test_water_filling_matches_one_by_one_greedy(loads: list[int], n: int, max_batch: int) -> None:
    core = DispatcherCore(DispatchConfig(max_batch_calls=max_batch))
    # Heaviest first: each filler task lands entirely on the executor that just came up.
    for i in sorted(range(len(loads)), key=lambda i: -loads[i]):
        assert core.executor_up(f"e{i}", 0) == []
        if loads[i]:
            cmds = core.start_task(f"fill{i}", "c", "f", [[j] for j in range(loads[i])], 0)
            assert {s.executor_id for s in cmds if isinstance(s, SendCalls)} == {f"e{i}"}
    cmds = core.start_task("t", "c", "f", [[j] for j in range(n)], 0)
    sends = [c for c in cmds if isinstance(c, SendCalls)]
    assert sends == cmds
    assert all(1 <= len(s.call_ids) <= max_batch for s in sends)
    received = Counter[str]()
    for s in sends:
        received[s.executor_id] += len(s.call_ids)
    assert sum(received.values()) == n
    final = [loads[i] + received[f"e{i}"] for i in range(len(loads))]
    assert sorted(final) == greedy_fill(loads, n)
    assert [core.executor_load(f"e{i}") for i in range(len(loads))] == final


# ---- the random-interleaving model ---------------------------------------------------------

POOL = ("e0", "e1", "e2")
KINDS = list(CallFailureKind)
SUB_CODES = ("lib@1", "lib@2")
SUB_FNS = ("sub", "f")  # "f" is also every root's function
MAX_DEPTH = 3

CONFIGS = [
    DispatchConfig(
        task_max_inflight_calls=3,
        initial_window=1,
        call_deadline_ms=100,
        max_collected_output_bytes=10**6,
        executor_heartbeat_timeout_ms=50,
        max_batch_calls=2,
        call_wall_limit_ms=10**12,
        cancel_grace_ms=10**12,
        retry=CallRetryPolicy(max_attempts=3, backoff_ms=5, backoff_max_ms=20),
    ),
    DispatchConfig(
        task_max_inflight_calls=4,
        initial_window=2,
        call_deadline_ms=80,
        max_collected_output_bytes=20,
        executor_heartbeat_timeout_ms=40,
        max_batch_calls=1,
        call_wall_limit_ms=10**12,
        cancel_grace_ms=10**12,
        retry=CallRetryPolicy(
            max_attempts=2,
            backoff_ms=0,
            backoff_max_ms=0,
            retry_on=frozenset({CallFailureKind.EXECUTOR_LOST, CallFailureKind.USER_ERROR}),
        ),
    ),
    DispatchConfig(
        task_max_inflight_calls=2,
        initial_window=8,
        call_deadline_ms=150,
        max_collected_output_bytes=10**6,
        executor_heartbeat_timeout_ms=60,
        max_batch_calls=3,
        call_wall_limit_ms=10**12,
        cancel_grace_ms=10**12,
        retry=CallRetryPolicy(max_attempts=1),
    ),
    DispatchConfig(
        task_max_inflight_calls=6,
        initial_window=1,
        call_deadline_ms=120,
        max_collected_output_bytes=10**6,
        executor_heartbeat_timeout_ms=45,
        max_batch_calls=4,
        call_wall_limit_ms=10**12,
        cancel_grace_ms=10**12,
        retry=CallRetryPolicy(
            max_attempts=4,
            backoff_ms=3,
            backoff_max_ms=10,
            retry_on=frozenset(
                {
                    CallFailureKind.EXECUTOR_LOST,
                    CallFailureKind.BUDGET_EXCEEDED,
                    CallFailureKind.IO_ERROR,
                }
            ),
        ),
    ),
]


@dataclass
class CallModel:
    task: str
    root: int  # -1 for a sub-call
    parent: int  # 0 for a root call
    code: str
    function: str
    args: list[Any]
    depth: int = 0
    sends: int = 0  # attempts started
    uncharged: int = 0  # of those, sent again uncharged after a neighbour's executor ended

    @property
    def attempts(self) -> int:
        return self.sends - self.uncharged


@dataclass
class TaskModel:
    n: int
    code: str
    function: str
    window: int
    grown: int = 0
    created: int = 0  # roots the core has made (sent, or waiting for an executor)
    sent: int = 0  # roots sent at least once: always the prefix range(sent)
    done: int = 0
    output_bytes: int = 0
    results: dict[int, bytes] = field(default_factory=dict)
    state: str = "running"  # running | converged | failed | cancelled
    calls: set[int] = field(default_factory=set)  # alive call ids


@dataclass
class Converged:
    success: bool
    code: FailureCode | None
    outputs: list[bytes]
    message_parts: list[str]


# (executor, parent call id, ok, value_json, error_kind, error or None when not checked).
# The executor is the parent's holder when the model predicts the resume, before the
# step's other effects (the same step may then cancel the parent, e.g. its task fails).
ResumeKey = tuple[str, int, bool, bytes, str, str | None]


def resume_key(r: ResumeWithResult) -> tuple[str, int, bool, bytes, str, str]:
    match r.result:
        case SubCallReturned(value_json=value_json):
            return (r.executor_id, r.call_id, True, value_json, "", "")
        case SubCallFailed(failure=failure):
            return (r.executor_id, r.call_id, False, b"null", failure.kind.value, failure.message)
        case _:
            assert_never(r.result)


@dataclass
class Expect:
    kills: list[str] = field(default_factory=list)
    cancels: set[tuple[str, int]] = field(default_factory=set)
    resumes: list[ResumeKey] = field(default_factory=list)
    converges: dict[str, Converged] = field(default_factory=dict)
    resends: set[int] = field(default_factory=set)  # must be sent again in this step
    new_roots: dict[str, int] = field(default_factory=dict)
    new_child: tuple[int, str, str, list[Any]] | None = None  # (parent, code, function, args)


def root_result(task: str, index: int) -> bytes:
    return f'"{task}:{index}"'.encode()


class DispatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = CONFIGS[0]
        self.core = DispatcherCore(self.cfg)
        self.now = 0
        self.up: dict[str, int] = {}  # executor -> last heartbeat (insertion order = up order)
        self.report: dict[str, tuple[int, int]] = {}  # last (running_call, running_us)
        self.holder: dict[int, str] = {}
        self.calls: dict[int, CallModel] = {}  # every call ever sent
        self.alive: set[int] = set()
        self.children: dict[int, set[int]] = {}
        self.pending: dict[int, int] = {}  # call -> retry due time
        self.waiting: set[int] = set()  # retries that fell due while no executor was up
        self.tasks: dict[str, TaskModel] = {}
        self.converged: set[str] = set()
        self.seq = 0

    @property
    def budget_us(self) -> int:
        return self.cfg.call_deadline_ms * 1000

    @initialize(cfg=st.sampled_from(CONFIGS), first=st.sampled_from([*POOL, None]))
    def setup(self, cfg: DispatchConfig, first: str | None) -> None:
        self.cfg = cfg
        self.core = DispatcherCore(cfg)
        if first is not None:
            self._executor_up(first)

    # ---- model transitions ----

    def _kill_call(self, cid: int) -> None:
        self.alive.discard(cid)
        self.pending.pop(cid, None)
        self.waiting.discard(cid)
        self.tasks[self.calls[cid].task].calls.discard(cid)

    def _cancel_descendants(self, cid: int, exp: Expect) -> None:
        stack = list(self.children.pop(cid, ()))
        while stack:
            child = stack.pop()
            if child not in self.alive:
                continue
            self._kill_call(child)
            if child in self.holder:
                exp.cancels.add((self.holder.pop(child), child))
            stack.extend(self.children.pop(child, ()))

    def _fail_task(self, task: str, code: FailureCode, parts: list[str], exp: Expect) -> None:
        t = self.tasks[task]
        for cid in sorted(t.calls):
            if cid in self.holder:
                exp.cancels.add((self.holder.pop(cid), cid))
            self._kill_call(cid)
        t.state = "failed"
        exp.converges[task] = Converged(False, code, [], parts)

    def _terminal(self, cid: int, kind: CallFailureKind, msg: str | None, exp: Expect) -> None:
        call = self.calls[cid]
        self._kill_call(cid)
        if call.parent:
            self.children.get(call.parent, set()).discard(cid)
            if call.parent in self.holder:
                exp.resumes.append(
                    (self.holder[call.parent], call.parent, False, b"null", kind.value, msg)
                )
            return
        parts = [f"#{call.root}", kind.value]
        if msg is not None:
            parts.append(msg)
            if call.attempts > 1:
                parts.append(f"after {call.attempts} attempts")
        self._fail_task(call.task, FailureCode.CALL_FAILED, parts, exp)

    def _fail_attempt(self, cid: int, kind: CallFailureKind, msg: str | None, exp: Expect) -> None:
        self._cancel_descendants(cid, exp)
        policy = self.cfg.retry
        attempts = self.calls[cid].attempts
        if kind in policy.retry_on and attempts < policy.max_attempts:
            self.pending[cid] = self.now + policy.backoff_for(attempts)
            return
        self._terminal(cid, kind, msg, exp)

    def _lose(self, ex: str, culprit: int, head: int, exp: Expect) -> list[int]:
        """The executor is gone. The call responsible (the culprit over its budget, else
        ``head``, the call the core said held the executor, or for one no longer held
        there the call that made it) and the calls there awaiting it fail this
        attempt; the others are returned, to be sent again uncharged (``_restart``)."""
        self.up.pop(ex, None)
        del self.report[ex]
        lost = sorted(c for c, e in self.holder.items() if e == ex)
        for cid in lost:
            del self.holder[cid]
        if culprit in lost:
            responsible = culprit
        elif head in lost:
            responsible = head
        else:
            responsible = self.calls[head].parent if head else 0
        charged: set[int] = set()
        while responsible in lost:
            charged.add(responsible)
            responsible = self.calls[responsible].parent
        uncharged: list[int] = []
        for cid in lost:
            if cid not in self.alive:
                continue
            if cid == culprit:
                self._fail_attempt(cid, CallFailureKind.BUDGET_EXCEEDED, None, exp)
            elif cid in charged:
                self._fail_attempt(cid, CallFailureKind.EXECUTOR_LOST, None, exp)
            else:
                uncharged.append(cid)
        for cid in uncharged:
            if cid in self.alive:
                self._cancel_descendants(cid, exp)
        return uncharged

    def _restart(self, uncharged: list[int], exp: Expect) -> None:
        """The uncharged calls of the executors a step ended, still wanted, go again."""
        for cid in uncharged:
            if cid in self.alive:
                self.calls[cid].uncharged += 1
                if self.up:
                    exp.resends.add(cid)
                else:
                    self.waiting.add(cid)

    def _fill(self, task: str, exp: Expect) -> None:
        t = self.tasks[task]
        k = min(t.window - (t.created - t.done), t.n - t.created)
        if k > 0:
            t.created += k
            if self.up:
                exp.new_roots[task] = exp.new_roots.get(task, 0) + k

    # ---- checking one step's commands ----

    def _check(self, out: list[DispatchCommand], exp: Expect) -> None:
        kills = [c.executor_id for c in out if isinstance(c, KillExecutor)]
        assert kills == exp.kills, out

        pairs = [
            (c.executor_id, cid) for c in out if isinstance(c, CancelCalls) for cid in c.call_ids
        ]
        assert all(c.call_ids for c in out if isinstance(c, CancelCalls))
        assert len(pairs) == len(set(pairs)), out
        assert set(pairs) == exp.cancels, out

        resumes = sorted(resume_key(r) for r in out if isinstance(r, ResumeWithResult))
        expected_resumes = sorted(exp.resumes, key=lambda r: r[:5])
        assert len(resumes) == len(expected_resumes), out
        for got, want in zip(resumes, expected_resumes, strict=True):
            assert got[:5] == want[:5], out
            assert want[5] is None or got[5] == want[5], out

        converges = [c for c in out if isinstance(c, ConvergeTaskCalls)]
        assert len({c.task_id for c in converges}) == len(converges), out
        assert {c.task_id for c in converges} == set(exp.converges), out
        for c in converges:
            want_c = exp.converges[c.task_id]
            assert c.task_id not in self.converged, f"{c.task_id} converged twice"
            self.converged.add(c.task_id)
            got_c = (
                (True, None, [o.value_json for o in c.outputs])
                if isinstance(c, CallsConverged)
                else (False, c.failure_code, [])
            )
            assert got_c == (
                want_c.success,
                want_c.code,
                want_c.outputs,
            ), c
            for part in want_c.message_parts:
                assert isinstance(c, CallsFailed), c
                assert part in c.failure_message, (part, c)

        new_roots: dict[str, list[int]] = {}
        child_seen = False
        for s in out:
            if not isinstance(s, SendCalls):
                continue
            assert s.executor_id in self.up, s
            assert s.budget_ms == self.cfg.call_deadline_ms
            assert 1 <= len(s.call_ids) == len(s.args) <= self.cfg.max_batch_calls
            task = self.tasks[s.task_id]
            assert task.state == "running", s
            for cid, args in zip(s.call_ids, s.args, strict=True):
                assert cid not in self.holder, f"call {cid} held by {self.holder.get(cid)}: {s}"
                if cid in self.calls:
                    assert cid in exp.resends, f"call {cid} sent again too early: {s}"
                    exp.resends.discard(cid)
                    call = self.calls[cid]
                    assert cid in self.alive
                elif exp.new_child is not None and not child_seen:
                    child_seen = True
                    parent, code, function, child_args = exp.new_child
                    pm = self.calls[parent]
                    call = CallModel(
                        pm.task, -1, parent, code, function, child_args, depth=pm.depth + 1
                    )
                    self.calls[cid] = call
                    self.alive.add(cid)
                    task.calls.add(cid)
                    self.children.setdefault(parent, set()).add(cid)
                else:
                    assert args[0] == s.task_id, s
                    call = CallModel(s.task_id, args[1], 0, task.code, task.function, args)
                    self.calls[cid] = call
                    self.alive.add(cid)
                    task.calls.add(cid)
                    new_roots.setdefault(s.task_id, []).append(args[1])
                assert call.task == s.task_id
                assert (s.code, s.function, args) == (call.code, call.function, call.args), s
                call.sends += 1
                self.holder[cid] = s.executor_id
        assert not exp.resends, f"due retries not sent: {exp.resends}"
        assert child_seen == (exp.new_child is not None), out
        assert {t: len(v) for t, v in new_roots.items()} == exp.new_roots, out
        for task_id, indexes in new_roots.items():
            t = self.tasks[task_id]
            assert sorted(indexes) == list(range(t.sent, t.sent + len(indexes)))
            t.sent += len(indexes)

    # ---- events ----

    def _executor_up(self, ex: str) -> None:
        if ex in self.up:
            with pytest.raises(BlockxUsageError):
                self.core.executor_up(ex, self.now)
            return
        exp = Expect(resends=set(self.waiting))
        exp.new_roots = {
            task: t.created - t.sent
            for task, t in self.tasks.items()
            if t.state == "running" and t.created > t.sent
        }
        self.waiting.clear()
        self.up[ex] = self.now
        self.report[ex] = (0, 0)
        self._check(self.core.executor_up(ex, self.now), exp)

    def _heartbeat(self, ex: str, running: int, running_us: int) -> None:
        head = self.core.holding_call(ex)
        out = self.core.executor_heartbeat(ex, running, running_us, self.now)
        exp = Expect()
        if ex in self.up:
            self.up[ex] = self.now
            self.report[ex] = (running, running_us)
            if running and running_us > self.budget_us:
                exp.kills.append(ex)
                # Its own call is blamed; a call it does not hold (let go by the core,
                # or held elsewhere) is stopped only by killing the executor.
                culprit = running if self.holder.get(running) == ex else 0
                self._restart(self._lose(ex, culprit, head, exp), exp)
        self._check(out, exp)

    def _complete(self, ex: str, batch: list[int]) -> None:
        results = [self._result(ex, cid) for cid in batch]
        exp = Expect()
        touched: list[str] = []
        for cid, res in zip(batch, results, strict=True):
            if self.holder.get(cid) != ex:
                continue
            del self.holder[cid]
            call = self.calls[cid]
            self._kill_call(cid)
            self._cancel_descendants(cid, exp)  # nothing can await them any more
            if call.parent:
                self.children.get(call.parent, set()).discard(cid)
                if call.parent in self.holder:
                    exp.resumes.append((self.holder[call.parent], call.parent, True, res, "", ""))
                continue
            t = self.tasks[call.task]
            t.results[call.root] = res
            t.output_bytes += len(res)
            t.done += 1
            t.grown += 1
            if call.task not in touched:
                touched.append(call.task)
        for task in touched:
            t = self.tasks[task]
            if t.output_bytes > self.cfg.max_collected_output_bytes:
                limit = str(self.cfg.max_collected_output_bytes)
                self._fail_task(task, FailureCode.OUTPUT_BYTES_EXCEEDED, [limit], exp)
                continue
            if t.done == t.n:
                assert not t.calls
                t.state = "converged"
                outputs = [t.results[i] for i in range(t.n)]
                exp.converges[task] = Converged(True, None, outputs, [])
                continue
            limit_calls = self.cfg.task_max_inflight_calls
            if t.grown >= t.window and t.window < limit_calls:
                t.window = min(limit_calls, 2 * t.window)
                t.grown = 0
            self._fill(task, exp)
        self._check(self.core.calls_completed(ex, batch, results, self.now), exp)

    def _result(self, ex: str, cid: int) -> bytes:
        if self.holder.get(cid) != ex:
            return b'"stale"'
        call = self.calls[cid]
        return root_result(call.task, call.root) if call.parent == 0 else f'"c{cid}"'.encode()

    def _held_by(self, ex: str) -> list[int]:
        return sorted(cid for cid, e in self.holder.items() if e == ex)

    def _tick(self) -> None:
        exp = Expect()
        timeout = self.cfg.executor_heartbeat_timeout_ms
        silent = {e: last for e, last in self.up.items() if self.now - last > timeout}
        heads = {e: self.core.holding_call(e) for e in silent}
        for ex in silent:  # none of them is sent a call again in this step
            del self.up[ex]
        uncharged: list[int] = []
        for ex, last in silent.items():
            running, used_us = self.report[ex]
            blamed = 0
            if (
                self.holder.get(running) == ex
                and used_us + (self.now - last) * 1000 > self.budget_us
            ):
                blamed = running
            exp.kills.append(ex)
            uncharged += self._lose(ex, blamed, heads[ex], exp)
        self._restart(uncharged, exp)
        due = {cid for cid, at in self.pending.items() if at <= self.now}
        for cid in due:
            del self.pending[cid]
        if self.up:
            exp.resends |= due
        else:
            self.waiting |= due
        self._check(self.core.tick(self.now), exp)

    # ---- rules ----

    @rule(data=st.data())
    def executor_event(self, data: st.DataObject) -> None:
        """Up, heartbeat or lost, weighted so that executors mostly stay up."""
        ex = data.draw(st.sampled_from(POOL))
        event = data.draw(st.sampled_from(["up", "up", "heartbeat", "heartbeat", "lost"]))
        if event == "up":
            self._executor_up(ex)
        elif event == "lost":
            exp = Expect()
            if ex in self.up:
                self._restart(self._lose(ex, 0, self.core.holding_call(ex), exp), exp)
            self._check(self.core.executor_lost(ex, "gone", self.now), exp)
        else:
            on_ex = sorted(c for c, e in self.holder.items() if e == ex)
            others = sorted(set(self.calls) - set(on_ex))
            running = data.draw(st.sampled_from([0, *on_ex, *on_ex, *others[-2:]]))
            b = self.budget_us
            running_us = data.draw(st.sampled_from([0, b // 2, b - 1, b, b + 1, 3 * b]))
            self._heartbeat(ex, running, running_us)

    @rule(n=st.integers(min_value=0, max_value=4), duplicate=st.integers(0, 7))
    def start_task(self, n: int, duplicate: int) -> None:
        running = sorted(t for t, m in self.tasks.items() if m.state == "running")
        if running and duplicate == 0:
            live = self.core.live_calls()
            with pytest.raises(BlockxUsageError):
                self.core.start_task(running[-1], "x", "f", [[running[-1], 0]], self.now)
            assert self.core.live_calls() == live
            return
        task = f"t{self.seq}"
        self.seq += 1
        args = [[task, i] for i in range(n)]
        out = self.core.start_task(task, f"code-{task}", "f", args, self.now)
        if n == 0:
            assert out == [CallsConverged(task_id=task, outputs=[])]
            assert not self.core.has_task(task)
            return
        window = min(self.cfg.initial_window, self.cfg.task_max_inflight_calls)
        self.tasks[task] = TaskModel(n=n, code=f"code-{task}", function="f", window=window)
        exp = Expect()
        self._fill(task, exp)
        self._check(out, exp)

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        choices = [ex for ex in self.up if self._held_by(ex)]
        if not choices:
            return
        ex = data.draw(st.sampled_from(choices))
        batch = data.draw(st.lists(st.sampled_from(self._held_by(ex)), min_size=1, unique=True))
        # Now and then a stale id rides along: a call this executor does not hold.
        stale = sorted(c for c in self.calls if self.holder.get(c) != ex)
        if stale and data.draw(st.integers(0, 3)) == 0:
            batch.append(data.draw(st.sampled_from(stale)))
        self._complete(ex, data.draw(st.permutations(batch)))

    @rule(data=st.data())
    def complete_more(self, data: st.DataObject) -> None:
        """Completions are the common event: a second rule doubles their weight."""
        self.complete(data)

    @rule(data=st.data())
    def complete_from_elsewhere(self, data: st.DataObject) -> None:
        known = sorted(self.calls)
        cid = data.draw(st.sampled_from([*known, 10**6]))
        others = [e for e in (*POOL, "ghost") if self.holder.get(cid) != e]
        ex = data.draw(st.sampled_from(others))
        assert self.core.calls_completed(ex, [cid], [b'"stale"'], self.now) == []

    @rule(data=st.data(), sub_call=st.booleans())
    def fail(self, data: st.DataObject, sub_call: bool) -> None:
        held = sorted(c for c in self.holder if (self.calls[c].parent != 0) == sub_call)
        if not held:
            return
        cid = data.draw(st.sampled_from(held))
        kind = data.draw(st.sampled_from(KINDS))
        cancel_on_executor = data.draw(st.booleans())
        msg = f"Traceback (most recent call last):\nValueError: boom {cid}"
        if data.draw(st.integers(0, 5)) == 0:
            wrong = data.draw(
                st.sampled_from([e for e in (*POOL, "ghost") if e != self.holder[cid]])
            )
            out = self.core.call_failed(
                wrong, cid, kind, msg, self.now, cancel_on_executor=cancel_on_executor
            )
            assert out == []
            return
        ex = self.holder.pop(cid)
        exp = Expect()
        if cancel_on_executor:
            exp.cancels.add((ex, cid))
        self._fail_attempt(cid, kind, msg, exp)
        out = self.core.call_failed(
            ex, cid, kind, msg, self.now, cancel_on_executor=cancel_on_executor
        )
        self._check(out, exp)

    @rule(data=st.data())
    def subcall(self, data: st.DataObject) -> None:
        held = sorted(c for c in self.holder if self.calls[c].depth < MAX_DEPTH)
        if not held:
            return
        parent = data.draw(st.sampled_from(held))
        args: list[Any] = ["sub", parent, self.seq]
        self.seq += 1
        if data.draw(st.integers(0, 5)) == 0:
            wrong = data.draw(
                st.sampled_from([e for e in (*POOL, "ghost") if e != self.holder[parent]])
            )
            out = self.core.subcall_requested(wrong, parent, "lib@1", "sub", args, self.now)
            assert out == []
            return
        ex = self.holder[parent]
        code = data.draw(st.sampled_from(SUB_CODES))
        function = data.draw(st.sampled_from(SUB_FNS))
        out = self.core.subcall_requested(ex, parent, code, function, args, self.now)
        assert [type(c) for c in out] == [SendCalls], out
        self._check(out, Expect(new_child=(parent, code, function, args)))

    @rule(data=st.data())
    def cancel_task(self, data: st.DataObject) -> None:
        if not self.tasks:
            return
        task = data.draw(st.sampled_from(sorted(self.tasks)))
        t = self.tasks[task]
        exp = Expect()
        if t.state == "running":
            for cid in sorted(t.calls):
                if cid in self.holder:
                    exp.cancels.add((self.holder.pop(cid), cid))
                self._kill_call(cid)
            t.state = "cancelled"
        self._check(self.core.cancel_task(task, self.now), exp)

    @rule(dt=st.one_of(st.integers(0, 8), st.integers(0, 8), st.integers(0, 90)))
    def tick(self, dt: int) -> None:
        self.now += dt
        self._tick()

    # ---- invariants ----

    @invariant()
    def bookkeeping_agrees_with_the_commands(self) -> None:
        for ex in POOL:
            held = sum(1 for e in self.holder.values() if e == ex)
            assert self.core.executor_load(ex) == held, ex
        assert sorted(self.core.executor_ids()) == sorted(self.up)
        unsent = sum(t.created - t.sent for t in self.tasks.values() if t.state == "running")
        assert self.core.live_calls() == len(self.alive) + unsent
        for task, t in self.tasks.items():
            assert self.core.has_task(task) == (t.state == "running")
            if t.state != "running":
                assert not t.calls
                continue
            inflight = t.created - t.done
            assert self.core.task_window(task) == t.window <= self.cfg.task_max_inflight_calls
            assert self.core.task_inflight(task) == inflight <= t.window
            held_roots = sum(1 for c in t.calls if c in self.holder and self.calls[c].parent == 0)
            assert held_roots <= inflight

    @invariant()
    def alive_sub_calls_have_a_held_parent(self) -> None:
        for cid in self.alive:
            parent = self.calls[cid].parent
            if parent:
                assert parent in self.alive
                assert parent in self.holder, f"child {cid} of parent {parent} awaiting retry"

    @invariant()
    def next_deadline_is_no_later_than_due_work(self) -> None:
        timeout = self.cfg.executor_heartbeat_timeout_ms
        due = [at for cid, at in self.pending.items()]
        due += [last + timeout + 1 for last in self.up.values()]
        deadline = self.core.next_deadline_ms()
        if due:
            assert deadline is not None
            assert deadline <= min(due)

    def teardown(self) -> None:
        """Drain: keep executors alive, let retries fall due, answer every call; every
        task must end and the core must be left empty."""
        step = min(self.cfg.retry.backoff_max_ms + 1, self.cfg.executor_heartbeat_timeout_ms)
        for _ in range(200):
            if not any(t.state == "running" for t in self.tasks.values()):
                break
            if not self.up:
                self._executor_up("e0")
            self.now += step
            for ex in list(self.up):
                self._heartbeat(ex, 0, 0)
            self._tick()
            for ex in list(self.up):
                batch = self._held_by(ex)
                if batch:
                    self._complete(ex, batch)
        assert not [task for task, t in self.tasks.items() if t.state == "running"]
        assert not self.alive
        assert self.core.live_calls() == 0
        assert all(self.core.executor_load(ex) == 0 for ex in POOL)


DispatchMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=60, deadline=None
)
TestDispatchProperty = DispatchMachine.TestCase
