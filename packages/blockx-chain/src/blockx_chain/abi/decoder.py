"""Decoding logs, calldata and raw ABI data with the registered ABIs.

The ABI decoding itself is ``faster-eth-abi`` (the C-compiled fork of ``eth-abi``,
same API and results); this module picks the entry a log or a transaction matches
and turns the library's values into plain, JSON-ready Python:

* integers of any size stay ``int``; ``bool`` and ``string`` as they are (a string
  that is no UTF-8 has its bad bytes replaced by U+FFFD, never an error);
* an address is lowercase ``0x`` hex; ``bytes`` and ``bytesN`` are ``0x`` hex;
  ``fixed``/``ufixed`` are decimal strings;
* an array is a list; a tuple (a struct) is a dict keyed by its components' names
  when the ABI names every one of them, a list otherwise;
* an event's or a call's ``args`` is a dict keyed by input name; an unnamed input is
  keyed ``_<position>`` (``_0`` for the first);
* an indexed input of a dynamic type (``string``, ``bytes``, any array, a tuple) is
  only its keccak hash in the topic: ``{"topic_hash": "0x..."}``.

A log matches an event when its topic0 is the event's (or, for an anonymous event,
when the ABI is registered for the log's address) and it has as many topics as the
event has indexed inputs; an ABI registered for addresses matches only their logs,
and is preferred over one registered for any address. A log that matches by topic0
but does not decode (data too short, a value out of its type's range) decodes as
None, as one no ABI matches: any contract can emit any log.

An event whose every input is a one-word type (``uintN``, ``intN``, ``address``,
``bool``, ``bytesN``; indexed inputs of a dynamic type aside, they are only hashes)
is decoded here word by word, without the library: the common events (Transfer,
Approval, Swap) are, and the library's per-value overhead was most of a log's
decoding time. The results and the refusals are the library's: a word outside its
type (a uint8 above 255, an address with nonzero high bytes, a bool other than 0
or 1, an intN that is not its sign extended, a bytesN with nonzero padding) or data
shorter than the words refuses the log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from eth_hash.auto import keccak
from faster_eth_abi.codec import ABICodec
from faster_eth_abi.decoding import StringDecoder
from faster_eth_abi.exceptions import DecodingError
from faster_eth_abi.registry import BaseEquals, registry

from blockx_chain.abi.spec import AbiError, Entry, Param, param_from_type

# Raw data decode() accepts: far above any log's or call's, bounded so that a
# function's request cannot make the Worker decode without end.
MAX_DATA_BYTES: Final = 4 * 1024 * 1024
MAX_TYPES: Final = 64


def _codec() -> ABICodec:
    strings = registry.copy()
    strings.unregister_decoder("string")
    strings.register_decoder(
        BaseEquals("string"), StringDecoder(handle_string_errors="replace"), label="string"
    )
    return ABICodec(strings)


_CODEC: Final = _codec()
_decode: Final = _CODEC.decode


class DecodeFailure(ValueError):
    """Data that does not decode as the types say; the message is one line."""


def topic0_of(entry: Entry) -> str:
    return "0x" + keccak(entry.signature.encode()).hex()


def selector_of(entry: Entry) -> str:
    return "0x" + keccak(entry.signature.encode()).hex()[:8]


# --- values -------------------------------------------------------------------------

Convert = Callable[[Any], Any] | None  # None: the library's value as it is


def _hex(value: bytes) -> str:
    return "0x" + value.hex()


def _address(value: str) -> str:
    return value.lower()


def converter(param: Param) -> Convert:
    """How a library value of ``param``'s type becomes the plain value above."""
    type_text = param.type
    bracket = type_text.rfind("[")
    if bracket >= 0 and type_text.endswith("]"):
        element = converter(
            Param(name=param.name, type=type_text[:bracket], components=param.components)
        )
        if element is None:
            return list
        return lambda values: [element(v) for v in values]
    if type_text == "tuple":
        components = param.components or ()
        parts = [converter(c) for c in components]
        names = [c.name for c in components]
        if all(names) and len(set(names)) == len(names):
            return lambda values: {
                n: v if c is None else c(v) for n, c, v in zip(names, parts, values, strict=True)
            }
        return lambda values: [v if c is None else c(v) for c, v in zip(parts, values, strict=True)]
    if type_text == "address":
        return _address
    if type_text.startswith("bytes") or type_text == "function":
        return _hex
    if type_text.startswith(("fixed", "ufixed")):
        return lambda value: format(Decimal(value), "f")
    return None


def _static(param: Param) -> bool:
    """Whether the type's encoding has a fixed size (no offset into a tail)."""
    type_text = param.type
    if type_text.endswith("[]") or type_text in ("string", "bytes"):
        return False
    if type_text.endswith("]"):
        element = type_text[: type_text.rindex("[")]
        return _static(Param(type=element, components=param.components))
    if type_text == "tuple":
        return all(_static(c) for c in param.components or ())
    return True


def _dynamic(param: Param) -> bool:
    """Whether an indexed input of this type holds only its hash in the topic."""
    return param.type.endswith("]") or param.type in ("string", "bytes", "tuple")


def arg_names(params: Sequence[Param]) -> list[str]:
    return [p.name or f"_{i}" for i, p in enumerate(params)]


def _data(hex_text: Any, what: str) -> bytes:
    if not isinstance(hex_text, str) or not hex_text.startswith("0x"):
        raise DecodeFailure(f"{what} must be 0x hex text, got {_shown(hex_text)}")
    digits = hex_text[2:]
    if len(digits) > 2 * MAX_DATA_BYTES:
        raise DecodeFailure(f"{what} is longer than {MAX_DATA_BYTES} bytes")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raw = b""
    # fromhex skips whitespace between bytes: the length says whether it did.
    if 2 * len(raw) != len(digits):
        raise DecodeFailure(f"{what} must be 0x hex with whole bytes, got {_shown(hex_text)}")
    return raw


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _library_decode(types: Sequence[str], data: bytes, what: str) -> tuple[Any, ...]:
    try:
        return _decode(types, data)
    except (DecodingError, OverflowError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if len(reason) > 200:
            reason = reason[:197] + "..."
        raise DecodeFailure(f"{what} does not decode as ({','.join(types)}): {reason}") from None


def decode(types: Any, data: Any) -> list[Any]:
    """``data`` (0x hex) decoded as ``types`` (a list of ABI type strings), as plain
    values; DecodeFailure (a ValueError) naming what is wrong."""
    if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
        raise DecodeFailure("decode(types, data): types must be a list of ABI type strings")
    if len(types) > MAX_TYPES:
        raise DecodeFailure(f"decode(types, data): more than {MAX_TYPES} types")
    try:
        params = [param_from_type(t) for t in types]
    except AbiError as exc:
        raise DecodeFailure(str(exc)) from None
    raw = _data(data, "data")
    values = _library_decode([p.canonical for p in params], raw, "data")
    return [v if c is None else c(v) for c, v in zip(map(converter, params), values, strict=True)]


# --- events -------------------------------------------------------------------------

# Reads the value of one 32-byte word at an offset of the raw bytes, or refuses it.
ReadWord = Callable[[bytes, int], Any]
_ONE_WORD: Final = re.compile(r"(uint|int|bytes)([0-9]+)|address|bool")


def _refused(type_text: str, word: bytes) -> DecodeFailure:
    return DecodeFailure(f"the word 0x{word.hex()} is no {type_text}")


def _read_uint(bits: int) -> ReadWord:
    if bits == 256:
        return lambda raw, at: int.from_bytes(raw[at : at + 32], "big")
    limit = 1 << bits

    def read(raw: bytes, at: int) -> int:
        value = int.from_bytes(raw[at : at + 32], "big")
        if value >= limit:
            raise _refused(f"uint{bits}", raw[at : at + 32])
        return value

    return read


def _read_int(bits: int) -> ReadWord:
    if bits == 256:
        return lambda raw, at: int.from_bytes(raw[at : at + 32], "big", signed=True)
    low, high = -(1 << (bits - 1)), 1 << (bits - 1)

    def read(raw: bytes, at: int) -> int:
        value = int.from_bytes(raw[at : at + 32], "big", signed=True)
        if not low <= value < high:
            raise _refused(f"int{bits}", raw[at : at + 32])
        return value

    return read


_ZERO_WORD: Final = bytes(32)


def _read_address(raw: bytes, at: int) -> str:
    if raw[at : at + 12] != _ZERO_WORD[:12]:
        raise _refused("address", raw[at : at + 32])
    return "0x" + raw[at + 12 : at + 32].hex()


def _read_bool(raw: bytes, at: int) -> bool:
    value = int.from_bytes(raw[at : at + 32], "big")
    if value > 1:
        raise _refused("bool", raw[at : at + 32])
    return value == 1


def _read_bytes(size: int) -> ReadWord:
    padding = _ZERO_WORD[size:]

    def read(raw: bytes, at: int) -> str:
        if raw[at + size : at + 32] != padding:
            raise _refused(f"bytes{size}", raw[at : at + 32])
        return "0x" + raw[at : at + size].hex()

    return read


def word_reader(type_text: str) -> ReadWord | None:
    """How to read a value of ``type_text`` (canonical) from its one word, the
    library's way; None for a type that is not one word of its own."""
    match = _ONE_WORD.fullmatch(type_text)
    if match is None:
        return None
    kind, size = match.group(1), match.group(2)
    if kind is None:
        return _read_address if type_text == "address" else _read_bool
    n = int(size)
    if size != str(n):  # "uint08" is no type
        return None
    if kind == "bytes":
        return _read_bytes(n) if 1 <= n <= 32 else None
    if not (8 <= n <= 256 and n % 8 == 0):
        return None
    return _read_uint(n) if kind == "uint" else _read_int(n)


class EventDecoder:
    """One event entry, compiled: which topics and which data words hold which input."""

    def __init__(self, entry: Entry, abi: str) -> None:
        self.entry = entry
        self.abi = abi
        self.name = entry.name
        self.signature = entry.signature
        self.topic0 = None if entry.anonymous else topic0_of(entry)
        names = arg_names(entry.inputs)
        # (position, name, converter) of each static indexed input; the topic index of
        # every indexed one.
        indexed = [(i, p) for i, p in enumerate(entry.inputs) if p.indexed]
        self.topic_count = len(indexed) + (0 if entry.anonymous else 1)
        first = 0 if entry.anonymous else 1
        self._hashed = [(names[i], first + k) for k, (i, p) in enumerate(indexed) if _dynamic(p)]
        static = [(k, i, p) for k, (i, p) in enumerate(indexed) if not _dynamic(p)]
        self._static_topics = [first + k for k, _, _ in static]
        self._static_types = [p.canonical for _, _, p in static]
        self._static_names = [(names[i], converter(p)) for _, i, p in static]
        body = [(i, p) for i, p in enumerate(entry.inputs) if not p.indexed]
        self._data_types = [p.canonical for _, p in body]
        self._data_names = [(names[i], converter(p)) for i, p in body]
        self._order = names
        # A data of static types alone can follow the static topics' words: then one
        # call of the library decodes the whole log (the common case: Transfer, Swap).
        self._at_once = all(_static(p) for _, p in body) and bool(
            self._static_types or self._data_types
        )
        self._all_types = self._static_types + self._data_types
        self._all_names = self._static_names + self._data_names
        # Every value one word (the static topics' words, then the data's): (name,
        # reader, byte offset) of each input in the ABI's order, or (name, None, topic
        # index) of a hash; None when some value is not one word (or two inputs share
        # a name: the library's way then says which value wins).
        self._words: list[tuple[str, ReadWord | None, int]] | None = None
        readers = [word_reader(t) for t in self._all_types]
        if all(readers) and len(set(names)) == len(names):
            hashes = dict(self._hashed)
            static_names = [n for n, _ in self._static_names]
            data_names = [n for n, _ in self._data_names]
            plan: list[tuple[str, ReadWord | None, int]] = []
            for name, param in zip(names, entry.inputs, strict=True):
                if name in hashes:
                    plan.append((name, None, hashes[name]))
                    continue
                word = (
                    static_names.index(name)
                    if param.indexed
                    else len(static_names) + data_names.index(name)
                )
                plan.append((name, readers[word], 32 * word))
            self._words = plan
        self._word_bytes = 32 * len(readers)

    @property
    def word_by_word(self) -> bool:
        """Whether this event's logs are decoded without the library."""
        return self._words is not None

    def decode(self, topics: Sequence[str], data: str) -> dict[str, Any]:
        """``{"name", "signature", "args"}`` of a log with these topics (all of them,
        topic0 first) and data; DecodeFailure when they do not fit."""
        self._check_data(data)
        if self._words is None:
            return self._decode_with_library(topics, data)
        raw = _data(
            "0x" + "".join(topics[t][2:] for t in self._static_topics) + data[2:],
            "the log's topics and data",
        )
        if len(raw) < self._word_bytes:
            raise DecodeFailure(
                f"the log's topics and data hold {len(raw)} bytes, and "
                f"({','.join(self._all_types)}) needs {self._word_bytes}"
            )
        return {
            "name": self.name,
            "signature": self.signature,
            "args": {
                name: {"topic_hash": topics[at]} if read is None else read(raw, at)
                for name, read, at in self._words
            },
        }

    def _check_data(self, data: Any) -> None:
        if not isinstance(data, str) or not data.startswith("0x"):
            raise DecodeFailure(f"the log's data must be 0x hex text, got {_shown(data)}")
        if not self._data_types and data != "0x":
            raise DecodeFailure(f"{self.signature} has no data, and the log has {_shown(data)}")

    def decode_with_library(self, topics: Sequence[str], data: str) -> dict[str, Any]:
        """``decode``, every value through the library (what decoding word by word
        must equal)."""
        self._check_data(data)
        return self._decode_with_library(topics, data)

    def _decode_with_library(self, topics: Sequence[str], data: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self._at_once:
            words = "".join(topics[t][2:] for t in self._static_topics)
            raw = _data("0x" + words + data[2:], "the log's topics and data")
            values = _library_decode(self._all_types, raw, "the log")
            for (name, convert), value in zip(self._all_names, values, strict=True):
                found[name] = value if convert is None else convert(value)
        else:
            if self._static_types:
                words = "".join(topics[t][2:] for t in self._static_topics)
                raw = _data("0x" + words, "a topic")
                values = _library_decode(self._static_types, raw, "topics")
                for (name, convert), value in zip(self._static_names, values, strict=True):
                    found[name] = value if convert is None else convert(value)
            if self._data_types:
                values = _library_decode(self._data_types, _data(data, "the log's data"), "data")
                for (name, convert), value in zip(self._data_names, values, strict=True):
                    found[name] = value if convert is None else convert(value)
        for name, t in self._hashed:
            found[name] = {"topic_hash": topics[t]}
        return {
            "name": self.name,
            "signature": self.signature,
            "args": {name: found[name] for name in self._order},
        }


class FunctionDecoder:
    def __init__(self, entry: Entry, abi: str) -> None:
        self.entry = entry
        self.abi = abi
        self.selector = selector_of(entry)
        self._types = [p.canonical for p in entry.inputs]
        self._names = list(zip(arg_names(entry.inputs), map(converter, entry.inputs), strict=True))

    def decode(self, data: bytes) -> dict[str, Any]:
        values = _library_decode(self._types, data, "the input")
        return {
            "function": self.entry.name,
            "signature": self.entry.signature,
            "args": {
                name: value if convert is None else convert(value)
                for (name, convert), value in zip(self._names, values, strict=True)
            },
        }


@dataclass(frozen=True, slots=True)
class RegisteredAbi:
    """One registry row: the ABI's name, entries and addresses (empty: any)."""

    name: str
    entries: tuple[Entry, ...]
    addresses: frozenset[str]


class UnknownEvent(LookupError):
    """No registered ABI by that name, or no such event in it; names what there is."""


_TOPICS: Final = ("topic0", "topic1", "topic2", "topic3")


class Decoder:
    """Every registered ABI, indexed for matching logs and transactions."""

    def __init__(self, abis: Iterable[RegisteredAbi]) -> None:
        self.abis: dict[str, RegisteredAbi] = {}
        # topic0 -> [(addresses or None for any, decoder)], address-bound first.
        self._by_topic0: dict[str, list[tuple[frozenset[str] | None, EventDecoder]]] = {}
        self._anonymous: dict[str, list[EventDecoder]] = {}
        self._by_selector: dict[str, list[tuple[frozenset[str] | None, FunctionDecoder]]] = {}
        self._events: dict[tuple[str, str], list[EventDecoder]] = {}
        for abi in sorted(abis, key=lambda a: a.name):
            self._add(abi)
        # An ABI registered for the log's address wins over one for any address.
        for events in self._by_topic0.values():
            events.sort(key=lambda c: c[0] is None)
        for functions in self._by_selector.values():
            functions.sort(key=lambda c: c[0] is None)

    def _add(self, abi: RegisteredAbi) -> None:
        self.abis[abi.name] = abi
        bound = abi.addresses or None
        for entry in abi.entries:
            if entry.type == "event":
                event = EventDecoder(entry, abi.name)
                self._events.setdefault((abi.name, entry.name), []).append(event)
                if event.topic0 is not None:
                    self._by_topic0.setdefault(event.topic0, []).append((bound, event))
                else:
                    for address in abi.addresses:
                        self._anonymous.setdefault(address, []).append(event)
            else:
                function = FunctionDecoder(entry, abi.name)
                self._by_selector.setdefault(function.selector, []).append((bound, function))

    def events(self, abi: str, event: str) -> list[EventDecoder]:
        """The entries named ``event`` (overloads included) of ABI ``abi``;
        UnknownEvent naming the ABIs or the events there are."""
        registered = self.abis.get(abi)
        if registered is None:
            known = ", ".join(sorted(self.abis)) or "none"
            raise UnknownEvent(f"no ABI named {abi!r} is registered (registered: {known})")
        found = self._events.get((abi, event))
        if not found:
            names = sorted({e.name for e in registered.entries if e.type == "event"})
            raise UnknownEvent(
                f"ABI {abi!r} has no event {event!r} (its events: {', '.join(names) or 'none'})"
            )
        return found

    def decode_log(
        self, log: Mapping[str, Any], only: Sequence[EventDecoder] | None = None
    ) -> dict[str, Any] | None:
        """The decoded event of a ``logs`` row, or None when no registered event
        matches it (or the one that matches does not decode it). ``only``: match
        these events alone (the event unit's)."""
        address = log.get("address")
        if not isinstance(address, str):
            raise DecodeFailure(f"a log row needs its address, got {_shown(address)}")
        address = address.lower()
        topics: list[str] = []
        for name in _TOPICS:
            topic = log.get(name)
            if topic is None:
                break
            if not isinstance(topic, str) or len(topic) != 66:
                raise DecodeFailure(
                    f"{name} of a log must be 32 bytes of 0x hex, got {_shown(topic)}"
                )
            topics.append(topic.lower())
        data = log.get("data", "0x")
        for event in self._candidates(address, topics, only):
            if event.topic_count != len(topics):
                continue
            try:
                return event.decode(topics, data)
            except DecodeFailure:
                continue
        return None

    def _candidates(
        self, address: str, topics: list[str], only: Sequence[EventDecoder] | None
    ) -> Iterable[EventDecoder]:
        if only is not None:
            for event in only:
                addresses = self.abis[event.abi].addresses
                if event.topic0 is None:
                    # Anonymous: only at an address its ABI is registered for.
                    if address in addresses:
                        yield event
                elif (not addresses or address in addresses) and topics[:1] == [event.topic0]:
                    yield event
            return
        if topics:
            for bound, event in self._by_topic0.get(topics[0], ()):
                if bound is None or address in bound:
                    yield event
        yield from self._anonymous.get(address, ())

    def decode_input(self, transaction: Mapping[str, Any]) -> dict[str, Any] | None:
        """``{"function", "signature", "args"}`` of a ``transactions`` row's input, or
        None when no registered function matches its selector (and its recipient)."""
        raw = transaction.get("input")
        data = _data(raw, "the transaction's input")
        if len(data) < 4:
            return None
        to = transaction.get("to_address")
        to = to.lower() if isinstance(to, str) else None
        for bound, function in self._by_selector.get("0x" + data[:4].hex(), ()):
            if bound is not None and to not in bound:
                continue
            try:
                return function.decode(data[4:])
            except DecodeFailure:
                continue
        return None
