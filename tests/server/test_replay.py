"""Replaying call records in real executor processes: every IO answer comes from
the record (localtestservice), a request it does not hold fails NOT_FOUND naming
it, an error recorded is raised in the function, and the code is the record's or
one given (an edited functions directory)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from blockx_core.call_record import (
    CallRecord,
    RecordedError,
    RecordedIo,
    decode_record,
    encode_record,
)
from blockx_core.failures import CallFailureKind, IoErrorKind
from blockx_server.calls.replay import (
    Replayer,
    ReplayFailed,
    ReplayRefused,
    ReplayReturned,
    load_functions,
)
from blockx_server.io.backends.localtestservice import (
    MAX_REQUEST_TEXT,
    LocalTestService,
    request_text,
)
from blockx_server.io.errors import BackendError

SOURCE = """\
from blockx_executor import IoError, call, io


async def block_volume(number):
    block = await io.blockdb.block(number)
    rows = await io.blockdb.rows("erc20_transfers", number, number)
    epoch = await io.meta.code_epoch()
    base = await io.router.chain("base").blockdb.head()
    total = sum(int(r["value"]) for r in rows)
    return {
        "hash": block["hash"],
        "volume": total,
        "label": await call("label", total),
        "epoch": epoch,
        "base_head": base,
    }


async def label(total):
    return await io.memory.get(f"label:{total}", "none")


async def careful(number):
    try:
        await io.rpc.eth_getBlockByNumber(number)
    except IoError as exc:
        return {"kind": exc.kind, "message": exc.message}
    return "answered"


async def careless(number):
    block = await io.rpc.eth_getBlockByNumber(number)
    return block["hash"][2:]
"""


def recorded(**changes: object) -> CallRecord:
    record = CallRecord(
        function="block_volume",
        args=[7],
        chain="devnet",
        code_epoch=4,
        code={"volume": SOURCE},
        io=[
            RecordedIo(backend="blockdb", op="block", args=[7], answer={"hash": "0x07"}),
            RecordedIo(
                backend="blockdb",
                op="rows",
                args=["erc20_transfers", 7, 7],
                answer=[{"value": str(2**100)}, {"value": "5"}],
            ),
            RecordedIo(backend="meta", op="code_epoch", args=[], answer=4),
            RecordedIo(backend="router", op="chain", args=["base", "blockdb", "head"], answer=90),
            RecordedIo(
                backend="memory", op="get", args=[f"label:{2**100 + 5}", "none"], answer="big"
            ),
        ],
    )
    return msgspec.structs.replace(record, **changes)


EXPECTED = {"hash": "0x07", "volume": 2**100 + 5, "label": "big", "epoch": 4, "base_head": 90}


@pytest.fixture
async def replayer() -> AsyncIterator[Replayer]:
    async with Replayer() as started:
        yield started


async def test_a_record_replays_to_the_same_result_sub_calls_and_other_chains_included(
    replayer: Replayer,
) -> None:
    # Through the file format, as a fixture on disk is read.
    record = decode_record(encode_record(recorded(result=EXPECTED)))
    outcome = await replayer.replay(record)
    assert outcome == ReplayReturned(value=record.result, served=5)


async def test_an_edited_answer_changes_the_result(replayer: Replayer) -> None:
    record = recorded()
    edited = [
        msgspec.structs.replace(e, answer=[{"value": "1"}]) if e.op == "rows" else e
        for e in record.io
    ]
    edited.append(RecordedIo(backend="memory", op="get", args=["label:1", "none"], answer="one"))
    outcome = await replayer.replay(msgspec.structs.replace(record, io=edited))
    assert isinstance(outcome, ReplayReturned)
    assert outcome.value == {**EXPECTED, "volume": 1, "label": "one"}


async def test_a_request_the_record_lacks_fails_not_found_naming_it(replayer: Replayer) -> None:
    outcome = await replayer.replay(recorded(), args=[8])
    assert isinstance(outcome, ReplayFailed)
    assert outcome.failure.kind is CallFailureKind.IO_ERROR
    headline = outcome.failure.message.splitlines()[0]
    assert headline.startswith(
        "IoError: NOT_FOUND: localtestservice: the fixture holds no answer to "
        "io.blockdb.block(8): the call asks what the recorded call did not (it holds 5 "
        "requests: io.blockdb.block(7), io.blockdb.rows('erc20_transfers', 7, 7), "
        "io.meta.code_epoch(), io.router.chain('base').blockdb.head()"
    )
    assert 'File "volume.py", line 5, in block_volume' in outcome.failure.message


async def test_a_truncated_record_says_why_a_request_is_missing(replayer: Replayer) -> None:
    record = recorded(io=recorded().io[:1], truncated=True)
    outcome = await replayer.replay(record)
    assert isinstance(outcome, ReplayFailed)
    assert "the record is truncated (its IO outgrew CALL_RECORD_MAX_BYTES)" in (
        outcome.failure.message
    )


async def test_an_error_recorded_is_raised_in_the_function_as_its_kind(
    replayer: Replayer,
) -> None:
    failing = RecordedIo(
        backend="rpc",
        op="eth_getBlockByNumber",
        args=[9],
        error=RecordedError(kind=IoErrorKind.UNAVAILABLE, message="node timed out after 10 s"),
    )
    record = recorded(io=[failing])
    handled = await replayer.replay(record, function="careful", args=[9])
    assert handled == ReplayReturned(
        value={"kind": "UNAVAILABLE", "message": "node timed out after 10 s"}, served=1
    )
    unhandled = await replayer.replay(record, function="careless", args=[9])
    assert isinstance(unhandled, ReplayFailed)
    assert unhandled.failure.kind is CallFailureKind.IO_ERROR
    assert unhandled.failure.message.startswith(
        "IoError: UNAVAILABLE: node timed out after 10 s\nTraceback"
    )
    assert 'File "volume.py", line 32, in careless' in unhandled.failure.message


async def test_a_user_error_fails_with_the_traceback_at_the_same_line(
    replayer: Replayer,
) -> None:
    record = recorded(
        io=[RecordedIo(backend="rpc", op="eth_getBlockByNumber", args=[3], answer=None)]
    )
    outcome = await replayer.replay(record, function="careless", args=[3])
    assert isinstance(outcome, ReplayFailed)
    assert outcome.failure.kind is CallFailureKind.USER_ERROR
    message = outcome.failure.message
    assert message.startswith("TypeError: 'NoneType' object is not subscriptable\n")
    assert 'File "volume.py", line 33, in careless' in message


async def test_edited_code_from_a_functions_directory_runs_against_the_record(
    replayer: Replayer, tmp_path: Path
) -> None:
    (tmp_path / "volume.py").write_text(
        SOURCE.replace('"volume": total,', '"volume": total, "rows": len(rows),')
    )
    (tmp_path / "_private.py").write_text("skipped = True\n")
    code = await load_functions(tmp_path)
    assert sorted(code) == ["volume"]
    outcome = await replayer.replay(recorded(), code=code)
    assert outcome == ReplayReturned(value={**EXPECTED, "rows": 2}, served=5)


async def test_replays_run_concurrently_each_with_its_own_record(replayer: Replayer) -> None:
    def with_hash(hash_: str) -> CallRecord:
        io = recorded().io
        return recorded(io=[msgspec.structs.replace(io[0], answer={"hash": hash_}), *io[1:]])

    outcomes = await asyncio.gather(*(replayer.replay(with_hash(f"0x{i}")) for i in range(4)))
    assert [o.value["hash"] for o in outcomes if isinstance(o, ReplayReturned)] == [
        "0x0",
        "0x1",
        "0x2",
        "0x3",
    ]


async def test_a_replay_without_code_or_with_code_that_does_not_load_is_refused(
    replayer: Replayer, tmp_path: Path
) -> None:
    with pytest.raises(ReplayRefused, match="the record holds no code"):
        await replayer.replay(recorded(code={}))
    with pytest.raises(ReplayRefused, match=r"the code does not load: .*label"):
        await replayer.replay(recorded(), code={"volume": SOURCE, "other": SOURCE})
    with pytest.raises(ReplayRefused, match="does not exist"):
        await load_functions(tmp_path / "missing")


async def test_a_missing_function_fails_function_not_found(replayer: Replayer) -> None:
    outcome = await replayer.replay(recorded(), function="nowhere")
    assert isinstance(outcome, ReplayFailed)
    assert outcome.failure.kind is CallFailureKind.FUNCTION_NOT_FOUND


async def test_identical_requests_get_their_answers_in_the_order_recorded() -> None:
    first, second = (
        RecordedIo(backend="rpc", op="eth_blockNumber", args=[], answer=n) for n in (1, 2)
    )
    service = LocalTestService([first, second])
    assert [service.answer("rpc", "eth_blockNumber", [], {}) for _ in range(3)] == [1, 2, 2]
    with pytest.raises(BackendError) as missing:
        service.answer("rpc", "eth_chainId", [], {})
    assert missing.value.kind is IoErrorKind.NOT_FOUND
    assert (service.served, service.missing) == (3, 1)


def test_a_request_is_named_with_its_arguments_shortened() -> None:
    text = request_text("blockdb", "rows", ["x" * 1000], {"limit": 5})
    assert text.startswith("io.blockdb.rows('xxx")
    assert text.endswith("...)")
    assert len(text) == len("io.blockdb.rows()") + MAX_REQUEST_TEXT
    assert request_text("blockdb", "block", [1], {"full": True}) == "io.blockdb.block(1, full=True)"
