"""A round trip over random ABI types: events of random inputs (nested tuples, fixed
and dynamic arrays, indexed arguments of static and dynamic types, anonymous or not)
are encoded with ``eth-abi``'s encoder (not the decoder's library), registered as
ABI JSON in a real SQLite block database, and decoded through ``io.logicalTypes``,
to the values expected as this test spells them out. Events of one-word inputs alone
(decoded word by word, without the library) have a round trip of their own, and a
differential test against the library over random words, out-of-range ones
included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from eth_abi.abi import encode
from eth_hash.auto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx_chain.abi.decoder import DecodeFailure, EventDecoder
from blockx_chain.abi.spec import entries_from_list
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.errors import IoOk
from blockx_server.io.router import IoRouter

ADDRESS = "0x" + "5a" * 20

# A type is a JSON ABI parameter: {"type", "components"?} (names are added later).
ONE_WORD = st.one_of(
    st.sampled_from([8, 16, 64, 112, 256]).map(lambda n: {"type": f"uint{n}"}),
    st.sampled_from([8, 24, 128, 256]).map(lambda n: {"type": f"int{n}"}),
    st.sampled_from([1, 4, 32]).map(lambda n: {"type": f"bytes{n}"}),
    st.sampled_from(["address", "bool"]).map(lambda t: {"type": t}),
)
LEAVES = st.one_of(ONE_WORD, st.sampled_from([{"type": "bytes"}, {"type": "string"}]))


def _array(element: dict[str, Any], size: int | None) -> dict[str, Any]:
    return dict(element, type=element["type"] + (f"[{size}]" if size else "[]"))


def _tuple(components: list[dict[str, Any]], named: bool) -> dict[str, Any]:
    return {
        "type": "tuple",
        "components": [dict(c, name=f"c{i}" if named else "") for i, c in enumerate(components)],
    }


TYPES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.builds(_array, inner, st.sampled_from([None, None, 1, 2])),
        st.builds(_tuple, st.lists(inner, min_size=1, max_size=3), st.booleans()),
    ),
    max_leaves=5,
)


def canonical(param: dict[str, Any]) -> str:
    type_text: str = param["type"]
    if type_text.startswith("tuple"):
        inner = ",".join(canonical(c) for c in param["components"])
        return f"({inner}){type_text[len('tuple') :]}"
    return type_text


def _split(param: dict[str, Any]) -> tuple[dict[str, Any], int | None] | None:
    """(element, size) of an array type; None for any other."""
    type_text: str = param["type"]
    if not type_text.endswith("]"):
        return None
    at = type_text.rindex("[")
    size = type_text[at + 1 : -1]
    return dict(param, type=type_text[:at]), int(size) if size else None


def values(param: dict[str, Any]) -> st.SearchStrategy[Any]:
    array = _split(param)
    if array is not None:
        element, size = array
        return st.lists(values(element), min_size=size or 0, max_size=size or 3)
    type_text: str = param["type"]
    if type_text == "tuple":
        return st.tuples(*(values(c) for c in param["components"]))
    if type_text.startswith("uint"):
        return st.integers(0, 2 ** int(type_text[4:]) - 1)
    if type_text.startswith("int"):
        bits = int(type_text[3:])
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if type_text.startswith("bytes") and type_text != "bytes":
        size = int(type_text[5:])
        return st.binary(min_size=size, max_size=size)
    return {
        "address": st.binary(min_size=20, max_size=20),
        "bool": st.booleans(),
        "bytes": st.binary(max_size=40),
        "string": st.text(max_size=8),
    }[type_text]


def expected(param: dict[str, Any], value: Any) -> Any:
    """The plain value io.logicalTypes promises for ``value`` of ``param``'s type."""
    array = _split(param)
    if array is not None:
        return [expected(array[0], v) for v in value]
    type_text: str = param["type"]
    if type_text == "tuple":
        parts = [expected(c, v) for c, v in zip(param["components"], value, strict=True)]
        names = [c["name"] for c in param["components"]]
        return dict(zip(names, parts, strict=True)) if all(names) else parts
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


def hashed(param: dict[str, Any]) -> bool:
    return param["type"] in ("string", "bytes", "tuple") or param["type"].endswith("]")


# One-word inputs, and now and then a dynamic one to index (its topic a hash).
ONE_WORD_EVENTS = st.one_of(ONE_WORD, ONE_WORD, ONE_WORD, st.just({"type": "string"}))


@st.composite
def events(
    draw: st.DrawFn, types_of: st.SearchStrategy[dict[str, Any]] = TYPES
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ABI entry, log row, the decoded event expected)."""
    anonymous = draw(st.booleans())
    types = draw(st.lists(types_of, min_size=1, max_size=5))
    most = 4 if anonymous else 3
    inputs: list[dict[str, Any]] = []
    for i, t in enumerate(types):
        indexed = draw(st.booleans()) and sum(p["indexed"] for p in inputs) < most
        if types_of is ONE_WORD_EVENTS and hashed(t):
            indexed = sum(p["indexed"] for p in inputs) < most  # else not one word
            if not indexed:
                continue
        inputs.append(dict(t, name=draw(st.sampled_from([f"p{i}", ""])), indexed=indexed))
    entry = {"type": "event", "name": "Fuzz", "anonymous": anonymous, "inputs": inputs}
    signature = f"Fuzz({','.join(canonical(p) for p in inputs)})"
    topics = [] if anonymous else ["0x" + keccak(signature.encode()).hex()]
    args: dict[str, Any] = {}
    body_types, body_values = [], []
    for i, param in enumerate(inputs):
        value = draw(values(param))
        name = param["name"] or f"_{i}"
        if param["indexed"] and hashed(param):
            topic = "0x" + draw(st.binary(min_size=32, max_size=32)).hex()
            topics.append(topic)
            args[name] = {"topic_hash": topic}
        elif param["indexed"]:
            topics.append("0x" + encode([canonical(param)], [value]).hex())
            args[name] = expected(param, value)
        else:
            body_types.append(canonical(param))
            body_values.append(value)
            args[name] = expected(param, value)
    log = {"address": ADDRESS, "data": "0x" + encode(body_types, body_values).hex()}
    for k, topic in enumerate(topics):
        log[f"topic{k}"] = topic
    return entry, log, {"name": "Fuzz", "signature": signature, "args": args}


def _round_trips(tmp_path: Path, cases: st.SearchStrategy[Any], word_by_word: bool) -> None:
    loop = asyncio.new_event_loop()
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    store = loop.run_until_complete(open_store(url))
    blockdb = BlockDbBackend(url, max_rows=100)
    router = IoRouter([blockdb, LogicalTypesBackend(blockdb, refresh_ms=0)])

    async def round_trip(entry: dict[str, Any], log: dict[str, Any]) -> Any:
        async with store.writer() as w:
            await w.put_abi("fuzz", [entry], [ADDRESS])
        outcome = await router.execute("logicalTypes", "decode_log", [log], {}, writes=False)
        assert isinstance(outcome, IoOk), outcome
        return outcome.decoded()

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cases)
    def check(case: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        entry, log, want = case
        if word_by_word:
            (parsed,) = entries_from_list([entry], "the drawn ABI")
            assert EventDecoder(parsed, "fuzz").word_by_word
        assert loop.run_until_complete(round_trip(entry, log)) == want

    try:
        check()
    finally:
        loop.run_until_complete(blockdb.close())
        loop.run_until_complete(store.close())
        loop.close()


def test_eth_abi_encoded_events_decode_through_io_logical_types(tmp_path: Path) -> None:
    _round_trips(tmp_path, events(), word_by_word=False)


def test_events_of_one_word_inputs_decode_word_by_word_through_io_logical_types(
    tmp_path: Path,
) -> None:
    _round_trips(tmp_path, events(ONE_WORD_EVENTS), word_by_word=True)


# --- decoding word by word against the library -----------------------------------

_EDGES = sorted(
    {e for bits in range(8, 257, 8) for e in (2**bits - 1, 2**bits, 2 ** (bits - 1) - 1)}
    | {2**256 - 2 ** (bits - 1) for bits in range(8, 257, 8)}  # the lowest intN
    | {2**256 - 2 ** (bits - 1) - 1 for bits in range(8, 256, 8)}  # one below it
    | {0, 1, 2, 2**256 - 1}
)


def _padded(value: int) -> bytes:
    return (value % 2**256).to_bytes(32, "big")


# A word: random, or at an edge of some type's range, or a value padded on the right
# (bytesN), or small.
WORDS = st.one_of(
    st.binary(min_size=32, max_size=32),
    st.sampled_from(_EDGES).map(_padded),
    st.integers(-300, 300).map(_padded),
    st.builds(
        lambda head, size: head[:size].ljust(32, b"\0"),
        st.binary(min_size=32, max_size=32),
        st.integers(1, 32),
    ),
    st.builds(
        lambda body, byte: body.ljust(32, bytes([byte])),
        st.binary(min_size=1, max_size=31),
        st.sampled_from([0, 1, 0xFF]),
    ),
)


def _edges(type_text: str) -> list[bytes]:
    """Words at the edges of ``type_text``'s range: the last ones in, the first out."""
    if type_text == "bool":
        values = [0, 1, 2, 256]
    elif type_text == "address":
        values = [2**160 - 1, 2**160, 2**255]
    elif type_text.startswith("uint"):
        bits = int(type_text[4:])
        values = [2**bits - 1, 2**bits, 2**255]
    elif type_text.startswith("int"):
        half = 2 ** (int(type_text[3:]) - 1)
        values = [half - 1, half, -half, -half - 1]
    else:
        size = int(type_text[5:])
        return [b"\xff" * size + b"\0" * (32 - size), b"\xff" * min(size + 1, 32) + b"\0" * 31]
    return [_padded(v) for v in values]


def _word_of(draw: st.DrawFn, param: dict[str, Any]) -> bytes:
    """Mostly a value of the type (a word out of range refuses the whole log, and
    would hide what the other words do), else an edge or any word."""
    valid = values(param).map(lambda v: encode([param["type"]], [v]))
    word: bytes = draw(st.one_of(valid, valid, st.sampled_from(_edges(param["type"])), WORDS))
    return word


@st.composite
def worded_logs(draw: st.DrawFn) -> tuple[EventDecoder, list[str], str]:
    """A one-word event (some inputs indexed) and the topics and data of a log of
    random words for it; the data now and then a word short, or longer."""
    types = draw(st.lists(ONE_WORD, min_size=1, max_size=5))
    indexed = [draw(st.booleans()) for _ in types][:3]
    inputs = [
        dict(t, name=f"p{i}", indexed=i < len(indexed) and indexed[i]) for i, t in enumerate(types)
    ]
    (entry,) = entries_from_list([{"type": "event", "name": "Words", "inputs": inputs}], "drawn")
    decoder = EventDecoder(entry, "words")
    assert decoder.word_by_word
    topics = [decoder.topic0 or ""] + ["0x" + draw(WORDS).hex() for p in inputs if p["indexed"]]
    body = [_word_of(draw, p) for p in inputs if not p["indexed"]]
    data = b"".join(body)
    cut = draw(st.sampled_from([0, 0, 0, -32, -1, 1, 32]))
    data = data[:cut] if cut < 0 else data + b"\x07" * cut
    return decoder, topics, "0x" + data.hex()


@settings(max_examples=100, deadline=None)
@given(worded_logs())
def test_decoding_word_by_word_gives_the_librarys_values_and_refusals(
    case: tuple[EventDecoder, list[str], str],
) -> None:
    decoder, topics, data = case
    try:
        want = decoder.decode_with_library(topics, data)
    except DecodeFailure:
        want = None
    try:
        got = decoder.decode(topics, data)
    except DecodeFailure:
        got = None
    assert got == want


ALL_ONE_WORD = [
    *(f"uint{n}" for n in range(8, 257, 8)),
    *(f"int{n}" for n in range(8, 257, 8)),
    *(f"bytes{n}" for n in range(1, 33)),
    "address",
    "bool",
]


def test_every_one_word_type_at_its_edges_is_decoded_as_the_library_does() -> None:
    compared = refused = 0
    for type_text in ALL_ONE_WORD:
        for indexed in (False, True):
            inputs = [{"name": "v", "type": type_text, "indexed": indexed}]
            (entry,) = entries_from_list([{"type": "event", "name": "E", "inputs": inputs}], "t")
            decoder = EventDecoder(entry, "edges")
            assert decoder.word_by_word
            for word in [*_edges(type_text), _padded(0), _padded(1), _padded(-1)]:
                topics, data = [decoder.topic0 or ""], "0x"
                if indexed:
                    topics.append("0x" + word.hex())
                else:
                    data += word.hex()
                try:
                    want = decoder.decode_with_library(topics, data)
                except DecodeFailure:
                    want = None
                    refused += 1
                try:
                    got = decoder.decode(topics, data)
                except DecodeFailure:
                    got = None
                assert got == want, (type_text, indexed, word.hex())
                compared += 1
    assert refused > len(ALL_ONE_WORD)  # every type refuses some edge, most several
    assert compared > refused
