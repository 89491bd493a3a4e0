"""A round trip over random ABI types: events of random inputs (nested tuples, fixed
and dynamic arrays, indexed arguments of static and dynamic types, anonymous or not)
are encoded with ``eth-abi``'s encoder (not the decoder's library), registered as
ABI JSON in a real SQLite block database, and decoded through ``io.logicalTypes``,
to the values expected as this test spells them out."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from eth_abi.abi import encode
from eth_hash.auto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_server.io.backends.blockdb import BlockDbBackend
from blockx_server.io.backends.logical_types import LogicalTypesBackend
from blockx_server.io.router import IoRouter

ADDRESS = "0x" + "5a" * 20

# A type is a JSON ABI parameter: {"type", "components"?} (names are added later).
LEAVES = st.one_of(
    st.sampled_from([8, 16, 64, 112, 256]).map(lambda n: {"type": f"uint{n}"}),
    st.sampled_from([8, 24, 128, 256]).map(lambda n: {"type": f"int{n}"}),
    st.sampled_from([1, 4, 32]).map(lambda n: {"type": f"bytes{n}"}),
    st.sampled_from(["address", "bool", "bytes", "string"]).map(lambda t: {"type": t}),
)


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


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ABI entry, log row, the decoded event expected)."""
    anonymous = draw(st.booleans())
    types = draw(st.lists(TYPES, min_size=1, max_size=5))
    most = 4 if anonymous else 3
    inputs: list[dict[str, Any]] = []
    for i, t in enumerate(types):
        indexed = draw(st.booleans()) and sum(p["indexed"] for p in inputs) < most
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


def test_eth_abi_encoded_events_decode_through_io_logical_types(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    url = parse_blockdb_url(f"sqlite:///{tmp_path}/chain.db")
    store = loop.run_until_complete(open_store(url))
    blockdb = BlockDbBackend(url, max_rows=100)
    router = IoRouter([blockdb, LogicalTypesBackend(blockdb, refresh_ms=0)])

    async def round_trip(entry: dict[str, Any], log: dict[str, Any]) -> Any:
        async with store.writer() as w:
            await w.put_abi("fuzz", [entry], [ADDRESS])
        outcome = await router.execute("logicalTypes", "decode_log", [log], {}, writes=False)
        assert outcome.ok, outcome.error
        return outcome.decoded()

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(events())
    def check(case: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        entry, log, want = case
        assert loop.run_until_complete(round_trip(entry, log)) == want

    try:
        check()
    finally:
        loop.run_until_complete(blockdb.close())
        loop.run_until_complete(store.close())
        loop.close()
