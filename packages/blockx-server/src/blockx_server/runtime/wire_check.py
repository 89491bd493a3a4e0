"""A strict check of protobuf wire bytes against a betterproto2 message's schema.

betterproto2's parser is lenient where protobuf is not, and lets bad bytes
through as wrong values: a string field sent as a varint is set to an int, a
truncated length-delimited field is cut short, an over-long varint is masked.
The servicer then fails on the value instead of the client being told. This
check runs first and names the first problem, as a client can act on it:

* varints that overflow 64 bits (longer than 10 bytes, or a 10th byte above 1);
* field number 0 or above 2**29 - 1, wire types 3, 4 (groups), 6 and 7;
* a field cut off by the end of the message;
* a known field sent with a wire type its type cannot have (packed repeated
  scalars are accepted, as protobuf writes them);
* a string that is not UTF-8;
* the same, recursively, inside message and map-entry fields, at most
  ``MAX_NESTING`` deep.

Unknown field numbers are accepted and skipped, as protobuf does.
"""

from __future__ import annotations

from typing import Final

import betterproto2
from betterproto2 import FieldMetadata, ProtoClassMetadata

MAX_NESTING: Final = 64

_VARINT: Final = 0
_FIXED64: Final = 1
_LEN: Final = 2
_FIXED32: Final = 5

_VARINT_TYPES: Final = frozenset(
    (
        betterproto2.TYPE_ENUM,
        betterproto2.TYPE_BOOL,
        betterproto2.TYPE_INT32,
        betterproto2.TYPE_INT64,
        betterproto2.TYPE_UINT32,
        betterproto2.TYPE_UINT64,
        betterproto2.TYPE_SINT32,
        betterproto2.TYPE_SINT64,
    )
)
_FIXED64_TYPES: Final = frozenset(
    (betterproto2.TYPE_DOUBLE, betterproto2.TYPE_FIXED64, betterproto2.TYPE_SFIXED64)
)
_FIXED32_TYPES: Final = frozenset(
    (betterproto2.TYPE_FLOAT, betterproto2.TYPE_FIXED32, betterproto2.TYPE_SFIXED32)
)
_MAX_FIELD_NUMBER: Final = (1 << 29) - 1


class WireError(Exception):
    """The bytes are not a valid encoding of the message; ``str()`` says where and why."""


def check_wire(data: bytes, message_type: type[betterproto2.Message]) -> None:
    """Raise WireError when ``data`` is not a valid ``message_type``."""
    _check_message(memoryview(data), message_type, "", 0)


def _varint(data: memoryview, pos: int, where: str) -> tuple[int, int]:
    value = 0
    for index in range(10):
        if pos + index >= len(data):
            raise WireError(f"{where}: a varint is cut off by the end of the message")
        byte = data[pos + index]
        if index == 9 and byte > 1:
            raise WireError(f"{where}: a varint overflows 64 bits")
        value |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return value, pos + index + 1
    raise AssertionError("a 10th byte of at most 1 ends every varint")


def _check_message(
    data: memoryview, message_type: type[betterproto2.Message], path: str, depth: int
) -> None:
    if depth > MAX_NESTING:
        raise WireError(f"{path or 'the message'}: messages nested deeper than {MAX_NESTING}")
    # betterproto2 builds this metadata lazily, once per class (a classproperty
    # whose typing mypy cannot follow on a class object).
    proto: ProtoClassMetadata = message_type._betterproto  # type: ignore[arg-type]
    meta_by_name = proto.meta_by_field_name
    name_by_number = proto.field_name_by_number
    classes = proto.cls_by_field
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos, path or "the message")
        number, wire_type = tag >> 3, tag & 0x7
        name = name_by_number.get(number)
        where = f"field {number}" + (f" ({path}{name})" if name else "")
        if not 1 <= number <= _MAX_FIELD_NUMBER:
            raise WireError(f"{where}: field numbers are 1 to {_MAX_FIELD_NUMBER}")
        if wire_type == _VARINT:
            _, end = _varint(data, pos, where)
        elif wire_type == _FIXED64:
            end = pos + 8
        elif wire_type == _FIXED32:
            end = pos + 4
        elif wire_type == _LEN:
            length, pos = _varint(data, pos, where)
            end = pos + length
        elif wire_type in (3, 4):
            raise WireError(f"{where}: groups (wire types 3 and 4) are not supported")
        else:
            raise WireError(f"{where}: {wire_type} is not a protobuf wire type")
        if end > len(data):
            raise WireError(f"{where}: cut off by the end of the message")
        if name is not None:
            _check_field(data[pos:end], wire_type, meta_by_name[name], where)
            # The path of nested fields reads like attribute access: task.function_call_config.
            if wire_type == _LEN and meta_by_name[name].proto_type in (
                betterproto2.TYPE_MESSAGE,
                betterproto2.TYPE_MAP,
            ):
                nested = data[pos:end]
                _check_nested(nested, meta_by_name[name], classes.get(name), path, name, depth)
        pos = end


def _check_field(value: memoryview, wire_type: int, meta: FieldMetadata, where: str) -> None:
    proto_type = meta.proto_type
    if proto_type in _VARINT_TYPES:
        expected, packed_width = _VARINT, 0
    elif proto_type in _FIXED64_TYPES:
        expected, packed_width = _FIXED64, 8
    elif proto_type in _FIXED32_TYPES:
        expected, packed_width = _FIXED32, 4
    else:  # string, bytes, message, map
        expected, packed_width = _LEN, -1
    if wire_type == expected:
        if proto_type == betterproto2.TYPE_STRING:
            try:
                str(value, "utf-8")
            except UnicodeDecodeError as exc:
                problem = f"a string that is not valid UTF-8 ({exc.reason})"
                raise WireError(f"{where}: {problem}") from None
        return
    if wire_type == _LEN and meta.repeated and packed_width >= 0:
        if packed_width:
            if len(value) % packed_width:
                problem = f"packed values are not a whole number of {packed_width} bytes"
                raise WireError(f"{where}: {problem}")
        else:
            pos = 0
            while pos < len(value):
                _, pos = _varint(value, pos, where)
        return
    raise WireError(
        f"{where}: a {proto_type} field cannot have wire type {wire_type} (expected {expected})"
    )


def _check_nested(
    value: memoryview,
    meta: FieldMetadata,
    field_class: type | None,
    path: str,
    name: str,
    depth: int,
) -> None:
    nested = meta.unwrap() if meta.unwrap is not None else field_class
    if isinstance(nested, type) and issubclass(nested, betterproto2.Message):
        _check_message(value, nested, f"{path}{name}.", depth + 1)
