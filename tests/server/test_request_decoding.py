"""RequestCodec and json_bounds: what a malformed request is told, as a table."""

from __future__ import annotations

import msgspec
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx_executor.results import json_depth
from blockx_proto import syncinvoker_v1, worker_v1
from blockx_server.runtime.json_bounds import (
    EXACT_DEPTH_BYTES,
    JsonTooDeep,
    check_json,
    decode_json,
)
from blockx_server.runtime.request_codec import REQUEST_CODEC

VALID = bytes(
    worker_v1.SubmitTaskRequest(
        task=worker_v1.TaskInput(
            task_id="t1",
            function_call_config=worker_v1.FunctionCallConfig(type="T", config="{}"),
        ),
        slot_id="s",
    )
)

MALFORMED = [
    # (body, words of the answer)
    (b"\x12\x05ab", "field 2 (slot_id): cut off by the end of the message"),
    (VALID[:-1], "field 2 (slot_id): cut off"),
    (b"\x12\x02\xc3\x28", "field 2 (slot_id): a string that is not valid UTF-8"),
    (b"\x10\x01", "field 2 (slot_id): a string field cannot have wire type 0"),
    (b"\x0a\x03\x08\x01\x00", "field 1 (task.task_id): a string field cannot have wire type 0"),
    (b"\x18" + b"\xff" * 10 + b"\x01", "field 3: a varint overflows 64 bits"),
    (b"\x18" + b"\xff" * 9 + b"\x02", "field 3: a varint overflows 64 bits"),
    (b"\x00\x01", "field 0: field numbers are 1 to"),
    (b"\x1b", "field 3: groups (wire types 3 and 4) are not supported"),
    (b"\x1e", "field 3: 6 is not a protobuf wire type"),
    (b"\x0a\x80", "field 1 (task): a varint is cut off"),
    (b"\x80", "the message: a varint is cut off"),
]


@pytest.mark.parametrize(("body", "words"), MALFORMED)
def test_malformed_requests_are_invalid_argument_naming_the_type(body: bytes, words: str) -> None:
    with pytest.raises(GRPCError) as refused:
        REQUEST_CODEC.decode(body, worker_v1.SubmitTaskRequest)
    assert refused.value.status is Status.INVALID_ARGUMENT
    message = refused.value.message or ""
    assert message.startswith("the request is not a valid worker.v1.SubmitTaskRequest: ")
    assert words in message


def test_valid_and_unknown_fields_decode() -> None:
    decoded = REQUEST_CODEC.decode(VALID + b"\xf8\x01\x05", worker_v1.SubmitTaskRequest)
    assert decoded.slot_id == "s"
    assert decoded.task is not None
    assert decoded.task.task_id == "t1"
    # A multi-byte varint into an int64 field.
    invoke = REQUEST_CODEC.decode(b"\x18\x96\x01", syncinvoker_v1.InvokeRequest)
    assert invoke.timeout_ms == 150


@pytest.mark.parametrize(
    ("text", "depth"),
    [("1", 0), ("[]", 1), ('{"a": [1, {"b": []}]}', 4), ("[" * 64 + "]" * 64, 64)],
)
def test_json_within_the_depth_decodes(text: str, depth: int) -> None:
    assert json_depth(decode_json(text)) == depth


@pytest.mark.parametrize("levels", [65, 1000, 100_000])
def test_json_nested_too_deep_is_a_decode_error(levels: int) -> None:
    with pytest.raises(JsonTooDeep, match="nested deeper than 64 levels"):
        decode_json("[" * levels + "]" * levels)
    with pytest.raises(JsonTooDeep):
        decode_json(('{"a":' * levels + "1" + "}" * levels).encode())
    with pytest.raises(JsonTooDeep):
        check_json("[" * levels + "]" * levels)


def test_a_large_document_is_checked_by_scanning() -> None:
    """Past EXACT_DEPTH_BYTES no values are built: flat JSON passes, JSON too deep
    for the decoder is JsonTooDeep, broken JSON a DecodeError."""
    flat = "[" + ",".join(["1"] * EXACT_DEPTH_BYTES) + "]"
    check_json(flat)
    deep = "[" * 100_000 + "]" * 100_000 + " " * EXACT_DEPTH_BYTES
    with pytest.raises(JsonTooDeep):
        check_json(deep)
    with pytest.raises(msgspec.DecodeError) as refused:
        check_json(flat[:-1])
    assert not isinstance(refused.value, JsonTooDeep)
