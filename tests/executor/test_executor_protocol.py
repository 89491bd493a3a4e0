"""Framing and messages of the Worker <-> Executor protocol, and the user-facing API."""

from __future__ import annotations

import struct
from typing import Any
from unittest.mock import ANY

import pytest

from blockx_core.failures import CallFailureKind
from blockx_executor import (
    CallError,
    FunctionHandle,
    IoError,
    call,
    current_call,
    function,
    in_call,
    io,
)
from blockx_executor.api import IoRequest, SubCallRequest
from blockx_executor.no_event_loop import NO_EVENT_LOOP
from blockx_executor.protocol import (
    MAX_FRAME_BYTES,
    CallContext,
    CallFailed,
    CallsCompleted,
    CancelCalls,
    ExecuteCalls,
    FailureKind,
    FrameDecoder,
    FrameEncoder,
    FromExecutor,
    Hello,
    IoRequested,
    LoadCode,
    ProtocolError,
    ResumeCall,
    SubCallRequested,
    ToExecutor,
    Unsendable,
)
from blockx_executor.sandbox import _hook

TO_EXECUTOR: list[Any] = [
    LoadCode("d1", "m", "def f(x):\n    return x\n"),
    ExecuteCalls("task", "d1", "f", 5_000_000, [1, 2], [[1], ["two", {"k": [3]}]]),
    ResumeCall(1, True, b'{"a":1}', io_us=17),
    ResumeCall(2, False, error_kind="UNKNOWN_OP", error="no"),
    ExecuteCalls(
        "task",
        "d1",
        "f",
        5_000_000,
        [3, 4],
        [[1], []],
        kwargs=[{}, {"to_block": 9}],
        contexts=[CallContext(17, "0xab"), None],
    ),
    ResumeCall(5, False, error_kind="UNAVAILABLE", error="down", retryable=True),
]
FROM_EXECUTOR: list[Any] = [
    Hello("x0.1", 123),
    CallsCompleted([1, 2], [b"1", b'"two"'], [5, 6], [0, 9]),
    CallFailed(3, "USER_ERROR", "ValueError: x", 10, 0),
    IoRequested(4, "memory", "get", ["k"]),
    IoRequested(5, "blockdb", "logs", [100], {"to_block": 200, "address": "0xa"}),
    SubCallRequested(6, "f", [1], {"x": 2}),
    CallFailed(7, "IO_ERROR", "IoError: UNKNOWN_BACKEND", retryable=False),
]


@pytest.mark.parametrize(
    ("messages", "kind"), [(TO_EXECUTOR, ToExecutor), (FROM_EXECUTOR, FromExecutor)]
)
def test_round_trip_in_one_frame(messages: list[Any], kind: Any) -> None:
    frame = FrameEncoder().encode(messages)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert FrameDecoder[Any](kind).feed(frame) == messages


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1000])
def test_frames_split_anywhere_and_several_per_read(chunk: int) -> None:
    encoder = FrameEncoder()
    stream = b"".join(encoder.encode([m]) for m in TO_EXECUTOR) + encoder.encode(TO_EXECUTOR)
    decoder = FrameDecoder[Any](ToExecutor)
    got: list[Any] = []
    for i in range(0, len(stream), chunk):
        got += decoder.feed(stream[i : i + chunk])
    assert got == TO_EXECUTOR + TO_EXECUTOR
    assert decoder.buffered == 0


def test_oversized_frame_is_refused() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameDecoder[Any](ToExecutor).feed(struct.pack(">I", MAX_FRAME_BYTES + 1))


def test_garbage_is_refused() -> None:
    with pytest.raises(ProtocolError, match="undecodable"):
        FrameDecoder[Any](ToExecutor).feed(struct.pack(">I", 3) + b"\x93\x01\x02")


# Around msgpack's 64-bit edges, and far beyond them.
INTEGERS = [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 2**200, -(2**200), 10**77]


@pytest.mark.parametrize("n", INTEGERS)
def test_integers_of_any_size_travel_both_ways(n: int) -> None:
    to_executor = ExecuteCalls("t", "d", "f", 1, [1], [[n, [n], {"k": n}]], kwargs=[{"n": n}])
    from_executor = [
        IoRequested(1, "memory", "get", [n], {"default": n}),
        SubCallRequested(2, "f", [{"deep": [n]}], {"n": n}),
    ]
    encoder = FrameEncoder()
    assert FrameDecoder[Any](ToExecutor).feed(encoder.encode([to_executor])) == [to_executor]
    assert FrameDecoder[Any](FromExecutor).feed(encoder.encode(from_executor)) == from_executor
    [got] = FrameDecoder[Any](ToExecutor).feed(encoder.encode([to_executor]))
    assert type(got.args[0][0]) is int


def test_big_integers_deep_in_long_rows_and_lists_travel_both_ways() -> None:
    # Long parts are first tried whole: one that encodes is kept, one that does not
    # is walked, at any depth.
    row = {f"c{i}": i for i in range(20)}
    long_list = [*range(12), 2**100]
    args = [[{"block": row, "log": dict(row, value=-(2**90)), "deep": [*[row] * 10, long_list]}]]
    batch = ExecuteCalls("t", "d", "f", 1, [1], args)
    [got] = FrameDecoder[Any](ToExecutor).feed(FrameEncoder().encode([batch]))
    assert got == batch
    assert type(got.args[0][0]["deep"][-1][-1]) is int
    assert got.args[0][0]["log"]["value"] == -(2**90)


def test_a_call_that_cannot_be_encoded_is_left_out_alone() -> None:
    batch = ExecuteCalls(
        "t", "d", "f", 1, [1, 2, 3], [[2**70], [object()], ["\udc80"]], kwargs=[{}, {}, {"a": 1}]
    )
    load = LoadCode("d", "m", "def f(x):\n    return x\n")
    frame, unsendable = FrameEncoder().encode_sendable([load, batch, CancelCalls([9])])
    assert FrameDecoder[Any](ToExecutor).feed(frame) == [
        load,
        ExecuteCalls("t", "d", "f", 1, [1], [[2**70]], kwargs=[{}]),
        CancelCalls([9]),
    ]
    assert [(u.message.call_ids, u.message.args) for u in unsendable] == [
        ([2], batch.args[1:2]),
        ([3], [["\udc80"]]),
    ]
    assert "object" in unsendable[0].reason
    assert "surrogates not allowed" in unsendable[1].reason


def test_a_long_row_that_cannot_be_encoded_is_left_out_alone() -> None:
    row = {f"c{i}": i for i in range(12)}
    batch = ExecuteCalls("t", "d", "f", 1, [1, 2], [[dict(row, v=2**70)], [dict(row, o=object())]])
    frame, unsendable = FrameEncoder().encode_sendable([batch])
    assert FrameDecoder[Any](ToExecutor).feed(frame) == [
        ExecuteCalls("t", "d", "f", 1, [1], [[dict(row, v=2**70)]])
    ]
    assert [u.message.call_ids for u in unsendable] == [[2]]
    assert "object" in unsendable[0].reason


def test_text_that_cannot_be_encoded_is_escaped_not_dropped() -> None:
    failed = CallFailed(1, "USER_ERROR", "ValueError: \udc80")
    sub = SubCallRequested(2, "f", ["\udc80"])
    frame, unsendable = FrameEncoder().encode_sendable([failed, sub])
    assert FrameDecoder[Any](FromExecutor).feed(frame) == [
        CallFailed(1, "USER_ERROR", "ValueError: \\udc80")
    ]
    assert [u.message for u in unsendable] == [sub]
    assert FrameEncoder().encode_sendable([object()]) == (b"", [Unsendable(ANY, ANY)])


def test_executor_failure_kinds_are_dispatcher_kinds() -> None:
    assert {k.value for k in FailureKind} <= {k.value for k in CallFailureKind}


def test_io_builds_read_requests() -> None:
    request = io.memory.get("k", 5)
    assert isinstance(request, IoRequest)
    assert (request.backend, request.op, request.args) == ("memory", "get", ["k", 5])
    assert repr(request) == "io.memory.get('k', 5)"


def test_awaiting_a_request_yields_it_and_returns_the_answer() -> None:
    async def fn() -> Any:
        return await io.chain.block(7)

    coro = fn()
    with NO_EVENT_LOOP:  # as the executor steps a call
        request = coro.send(None)
        assert isinstance(request, IoRequest)
        assert request.op == "block"
        with pytest.raises(StopIteration) as done:
            coro.send({"number": 7})
    assert done.value.value == {"number": 7}


def test_io_requests_carry_keyword_arguments() -> None:
    request = io.blockdb.logs(100, to_block=200, address="0xa")
    assert isinstance(request, IoRequest)
    assert (request.args, request.kwargs) == ([100], {"to_block": 200, "address": "0xa"})
    assert repr(request) == "io.blockdb.logs(100, to_block=200, address='0xa')"


def test_sub_calls_carry_keyword_arguments_even_one_named_function() -> None:
    request = call("other", 1, x=2, function="f")
    assert isinstance(request, SubCallRequest)
    assert (request.function, request.args, request.kwargs) == (
        "other",
        [1],
        {"x": 2, "function": "f"},
    )
    assert repr(request) == "call('other', 1, x=2, function='f')"


def test_call_builds_a_sub_call() -> None:
    request = call("other", 1, "x")
    assert isinstance(request, SubCallRequest)
    assert (request.function, request.args) == ("other", [1, "x"])
    with pytest.raises(TypeError, match="function name"):
        call("")


def test_private_attributes_are_not_backends() -> None:
    with pytest.raises(AttributeError):
        io._secret  # noqa: B018
    with pytest.raises(AttributeError):
        io.memory._op  # noqa: B018


def test_current_call_outside_an_executor() -> None:
    with pytest.raises(RuntimeError, match="only available inside a BlockX call"):
        current_call()
    assert not in_call()


async def test_awaited_outside_an_executor_each_says_what_to_use_instead() -> None:
    """On a program's own event loop (here pytest's), not asyncio's "Task got bad yield"."""
    with pytest.raises(RuntimeError) as sub_call:
        await call("price", 1)
    assert str(sub_call.value) == (
        "call('price', 1) can only be awaited inside a BlockX function, where the executor "
        "answers it; outside one, run the function through the Sync Invoker: await "
        "Client().function('price').call(...) from blockx_client"
    )
    with pytest.raises(RuntimeError, match=r"Client\(\)\.function\('price'\)\.call"):
        await function("price").call(1)
    with pytest.raises(RuntimeError, match=r"^io\.memory\.get\('k'\) can only be awaited"):
        await io.memory.get("k")


def test_a_function_handle_builds_the_same_sub_call() -> None:
    handle = function("other")
    assert isinstance(handle, FunctionHandle)
    assert (handle.name, repr(handle)) == ("other", "function('other')")
    request = handle.call(1, "x")
    assert isinstance(request, SubCallRequest)
    assert (request.function, request.args, request.kwargs) == ("other", [1, "x"], {})
    with pytest.raises(TypeError, match="function name"):
        function("")


def test_errors_carry_their_kind() -> None:
    err = IoError("UNKNOWN_OP", "no such op")
    assert (err.kind, err.message, str(err)) == (
        "UNKNOWN_OP",
        "no such op",
        "UNKNOWN_OP: no such op",
    )
    assert isinstance(CallError("USER_ERROR", ""), Exception)
    assert not err.retryable
    assert IoError("UNAVAILABLE", "down", retryable=True).retryable


@pytest.mark.parametrize(
    ("event", "args", "denied"),
    [
        ("socket.connect", (None, ("1.2.3.4", 80)), True),
        ("subprocess.Popen", ("true", ["true"], None, None), True),
        ("os.system", ("ls",), True),
        ("open", ("/tmp/x", "w", 0), True),
        ("open", ("/tmp/x", "a+", 0), True),
        ("open", ("/tmp/x", None, 0o1101), True),  # os.open(O_WRONLY | O_CREAT | O_TRUNC)
        ("open", ("/tmp/x", "r", 0), False),
        ("open", ("/tmp/x", "rb", 0), False),
        ("os.remove", ("/tmp/x", -1), True),
        ("import", ("json", None, [], [], []), False),
    ],
)
def test_sandbox_hook(event: str, args: tuple[Any, ...], denied: bool) -> None:
    if denied:
        with pytest.raises(PermissionError, match="BlockX functions cannot"):
            _hook(event, args)
    else:
        _hook(event, args)
