"""ABI entries: what ``blockx chain abi add`` registers and the decoder reads.

An ABI comes as a compiler's JSON (a list of entries, or an artifact object with an
``"abi"`` list, as Foundry and Hardhat write) or as human-readable signatures
(``event Swap(address indexed sender, uint256 amount0In)``, ``function
transfer(address to, uint256 amount)``, ``event Raw(bytes32 a) anonymous``). Both
become the same normalized JSON entries, which the registry stores.

Events and functions are kept; constructors, errors, fallback and receive entries
are accepted and dropped (nothing decodes by them). Every malformed input is an
AbiError of one line naming what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import msgspec

# Bounds on what one ABI may hold: far above any real contract's, low enough that
# a hostile file cannot make the registry or the decoder slow.
MAX_ENTRIES: Final = 2000
MAX_PARAMS: Final = 64
MAX_DEPTH: Final = 8
MAX_NAME: Final = 128
MAX_SIGNATURE: Final = 4096

_ADDRESS: Final = re.compile(r"0x[0-9a-f]{40}")
_NAME: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_ARRAYS: Final = re.compile(r"(?:\[(?:[1-9][0-9]{0,5})?\])*")
_ELEMENTARY: Final = re.compile(
    r"(?P<base>uint|int|bytes|fixed|ufixed)(?P<size>[0-9x]*)|address|bool|string|function"
)


class AbiError(ValueError):
    """An ABI or a signature that cannot be used; the message is one line."""


class Param(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One input: ``type`` as the ABI JSON spells it (``tuple`` with ``components``
    for a struct, array suffixes after either)."""

    name: str = ""
    type: str
    indexed: bool = False
    components: tuple[Param, ...] | None = None

    @property
    def canonical(self) -> str:
        """The type as signatures and the decoder spell it: aliases expanded
        (``uint`` is ``uint256``), a tuple as ``(t1,t2)``."""
        if self.type.startswith("tuple"):
            inner = ",".join(c.canonical for c in self.components or ())
            return f"({inner}){self.type[len('tuple') :]}"
        return _expand_alias(self.type)


class Entry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An event or a function."""

    type: str  # "event" or "function"
    name: str
    inputs: tuple[Param, ...] = ()
    anonymous: bool = False

    @property
    def signature(self) -> str:
        """``Transfer(address,address,uint256)``: what the topic0 or selector hashes."""
        return f"{self.name}({','.join(p.canonical for p in self.inputs)})"

    @property
    def text(self) -> str:
        """The entry as a human-readable signature, names and ``indexed`` included."""
        params = ", ".join(
            " ".join(part for part in (p.canonical, "indexed" if p.indexed else "", p.name) if part)
            for p in self.inputs
        )
        tail = " anonymous" if self.anonymous else ""
        return f"{self.type} {self.name}({params}){tail}"


def _expand_alias(type_text: str) -> str:
    for alias, full in (("uint", "uint256"), ("int", "int256")):
        if type_text == alias or type_text.startswith(alias + "["):
            return full + type_text[len(alias) :]
    return type_text


def check_elementary(type_text: str, where: str) -> None:
    """AbiError unless ``type_text`` is an elementary ABI type with array suffixes."""
    bracket = type_text.find("[")
    base, arrays = (type_text, "") if bracket < 0 else (type_text[:bracket], type_text[bracket:])
    match = _ELEMENTARY.fullmatch(base)
    if match is None or _ARRAYS.fullmatch(arrays) is None or not _sized(match):
        raise AbiError(f"{where}: {type_text!r} is no ABI type")


def _sized(match: re.Match[str]) -> bool:
    base, size = match.group("base"), match.group("size")
    if base is None:
        return True
    if base in ("uint", "int"):
        return size == "" or (size.isdigit() and int(size) % 8 == 0 and 8 <= int(size) <= 256)
    if base == "bytes":
        return size == "" or (size.isdigit() and 1 <= int(size) <= 32)
    # fixed<M>x<N> / ufixed<M>x<N>
    parts = size.split("x")
    return size == "" or (
        len(parts) == 2
        and all(p.isdigit() for p in parts)
        and int(parts[0]) % 8 == 0
        and 8 <= int(parts[0]) <= 256
        and 1 <= int(parts[1]) <= 80
    )


# --- ABI JSON ---------------------------------------------------------------------


def entries_from_json(text: str | bytes, source: str) -> list[Entry]:
    """The events and functions of an ABI file's text; AbiError naming ``source``."""
    try:
        document = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise AbiError(f"{source} is not JSON: {exc}") from None
    if isinstance(document, dict) and isinstance(document.get("abi"), list):
        document = document["abi"]  # a Foundry or Hardhat artifact
    if not isinstance(document, list):
        raise AbiError(f"{source} must hold a JSON list of ABI entries (or an object with 'abi')")
    return entries_from_list(document, source)


def entries_from_list(document: Sequence[Any], source: str) -> list[Entry]:
    if len(document) > MAX_ENTRIES:
        raise AbiError(f"{source} has {len(document)} entries, more than {MAX_ENTRIES}")
    entries: list[Entry] = []
    for position, raw in enumerate(document):
        where = f"{source} entry {position}"
        if not isinstance(raw, dict):
            raise AbiError(f"{where} must be an object, got {_shown(raw)}")
        kind = raw.get("type", "function")
        if kind in ("constructor", "error", "fallback", "receive"):
            continue
        if kind not in ("event", "function"):
            raise AbiError(
                f"{where} has type {_shown(kind)}; ABI entries are events, functions, "
                "errors, constructors, fallback or receive"
            )
        name = _name(raw.get("name"), f"{where} name", allow_empty=False)
        inputs = _params(
            raw.get("inputs", []), f"{where} ({name}) inputs", 1, event=kind == "event"
        )
        anonymous = raw.get("anonymous", False)
        if not isinstance(anonymous, bool):
            raise AbiError(f"{where} ({name}): anonymous must be true or false")
        entries.append(
            Entry(type=kind, name=name, inputs=inputs, anonymous=anonymous and kind == "event")
        )
    check_entries(entries, source)
    return entries


def _params(raw: Any, where: str, depth: int, *, event: bool) -> tuple[Param, ...]:
    if not isinstance(raw, list):
        raise AbiError(f"{where} must be a list")
    if len(raw) > MAX_PARAMS:
        raise AbiError(f"{where} has {len(raw)} parameters, more than {MAX_PARAMS}")
    if depth > MAX_DEPTH:
        raise AbiError(f"{where} nests tuples deeper than {MAX_DEPTH}")
    params: list[Param] = []
    for position, item in enumerate(raw):
        here = f"{where}[{position}]"
        if not isinstance(item, dict):
            raise AbiError(f"{here} must be an object, got {_shown(item)}")
        name = _name(item.get("name", ""), f"{here} name", allow_empty=True)
        type_text = item.get("type")
        if not isinstance(type_text, str):
            raise AbiError(f"{here} ({name or 'unnamed'}) has no type")
        indexed = item.get("indexed", False)
        if not isinstance(indexed, bool) or (indexed and not event):
            raise AbiError(f"{here}: indexed must be true or false, and only in an event")
        components = None
        if type_text.startswith("tuple"):
            if _ARRAYS.fullmatch(type_text[len("tuple") :]) is None:
                raise AbiError(f"{here}: {type_text!r} is no ABI type")
            components = _params(
                item.get("components"), f"{here} components", depth + 1, event=False
            )
            if not components:
                raise AbiError(f"{here}: a tuple needs at least one component")
        else:
            check_elementary(type_text, here)
        params.append(Param(name=name, type=type_text, indexed=indexed, components=components))
    return tuple(params)


def _name(raw: Any, where: str, *, allow_empty: bool) -> str:
    if raw is None and allow_empty:
        return ""
    if not isinstance(raw, str) or (raw == "" and not allow_empty):
        raise AbiError(f"{where} must be a name, got {_shown(raw)}")
    if raw and (len(raw) > MAX_NAME or _NAME.fullmatch(raw) is None):
        raise AbiError(f"{where} {_shown(raw)} is no identifier")
    return raw


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_entries(entries: Sequence[Entry], source: str) -> None:
    """AbiError for an event with more than three indexed inputs (four topics at most,
    topic0 the signature's), or five for an anonymous one."""
    for entry in entries:
        indexed = sum(p.indexed for p in entry.inputs)
        most = 4 if entry.anonymous else 3
        if indexed > most:
            raise AbiError(
                f"{source}: event {entry.name} has {indexed} indexed inputs; a log has room "
                f"for {most}"
            )


def entries_json(entries: Sequence[Entry]) -> list[Any]:
    """The entries as the registry stores them: ABI JSON."""
    out: list[Any] = msgspec.to_builtins(list(entries))
    return out


def entries_from_stored(stored: Any, source: str) -> list[Entry]:
    """The entries of a registry row's ``abi`` column."""
    if isinstance(stored, str | bytes):
        return entries_from_json(stored, source)
    if not isinstance(stored, list):
        raise AbiError(f"{source}: the stored ABI is no list")
    return entries_from_list(stored, source)


# --- Human-readable signatures -----------------------------------------------------

_TOKEN: Final = re.compile(r"\s*(?:(?P<punct>[(),\[\]])|(?P<word>[A-Za-z0-9_$]+))")


def entry_from_signature(text: str) -> Entry:
    """``event Name(type [indexed] [name], ...) [anonymous]`` or ``function
    Name(type [name], ...)``; tuples as ``(t1 a, t2 b)[]`` or ``tuple(...)``."""
    if len(text) > MAX_SIGNATURE:
        raise AbiError(f"the signature is longer than {MAX_SIGNATURE} characters")
    tokens = _tokens(text)
    parser = _SignatureParser(tokens, text)
    return parser.entry()


def param_from_type(text: str) -> Param:
    """One type as a signature spells it (``uint256``, ``(address,bytes)[]``), as an
    unnamed Param; AbiError when it is no ABI type."""
    if len(text) > MAX_SIGNATURE:
        raise AbiError(f"the type is longer than {MAX_SIGNATURE} characters")
    parser = _SignatureParser(_tokens(text), text)
    param = parser._param(1, event=False)
    if parser.at != len(parser.tokens) or param.name:
        raise AbiError(f"{text!r} is no ABI type")
    return param


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    at = 0
    stripped = text.rstrip()
    while at < len(stripped):
        match = _TOKEN.match(stripped, at)
        if match is None:
            raise AbiError(
                f"signature {text!r}: unexpected {stripped[at:].lstrip()[:1]!r} at "
                f"character {at + 1}"
            )
        tokens.append(match.group("punct") or match.group("word"))
        at = match.end()
    return tokens


class _SignatureParser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.at = 0
        self.text = text

    def _fail(self, what: str) -> AbiError:
        seen = self.tokens[self.at] if self.at < len(self.tokens) else "the end"
        return AbiError(f"signature {self.text!r}: {what}, found {seen!r}")

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            raise self._fail(f"expected {expected!r}" if expected else "expected more")
        self.at += 1
        return token

    def entry(self) -> Entry:
        kind = self._take()
        if kind not in ("event", "function"):
            raise AbiError(
                f"signature {self.text!r} must start with 'event' or 'function', not {kind!r}"
            )
        name = self._peek() or ""
        if _NAME.fullmatch(name) is None or len(name) > MAX_NAME:
            raise self._fail(f"expected the {kind}'s name")
        self.at += 1
        inputs = self._params(1, event=kind == "event")
        anonymous = False
        rest = self.tokens[self.at :]
        if kind == "function":
            # ``view``, ``returns (...)`` and the like say nothing the decoder uses.
            self.at = len(self.tokens)
        elif rest == ["anonymous"]:
            anonymous = True
            self.at += 1
        elif rest:
            raise self._fail("expected the end or 'anonymous'")
        entry = Entry(type=kind, name=name, inputs=inputs, anonymous=anonymous)
        check_entries([entry], f"signature {self.text!r}")
        return entry

    def _params(self, depth: int, *, event: bool) -> tuple[Param, ...]:
        if depth > MAX_DEPTH:
            raise AbiError(f"signature {self.text!r} nests tuples deeper than {MAX_DEPTH}")
        self._take("(")
        params: list[Param] = []
        if self._peek() == ")":
            self.at += 1
            return ()
        while True:
            params.append(self._param(depth, event=event))
            if len(params) > MAX_PARAMS:
                raise AbiError(f"signature {self.text!r} has more than {MAX_PARAMS} parameters")
            if self._take() == ")":
                return tuple(params)
            self.at -= 1
            self._take(",")

    def _param(self, depth: int, *, event: bool) -> Param:
        components = None
        if self._peek() == "tuple":
            self.at += 1
        if self._peek() == "(":
            components = self._params(depth + 1, event=False)
            if not components:
                raise self._fail("a tuple needs at least one component")
            type_text = "tuple"
        else:
            type_text = self._take()
        type_text += self._arrays()
        if components is None:
            check_elementary(type_text, f"signature {self.text!r}")
        indexed = False
        if self._peek() == "indexed":
            if not event:
                raise self._fail("'indexed' only marks an event's inputs")
            indexed = True
            self.at += 1
        name = ""
        token = self._peek()
        if token is not None and token not in (",", ")"):
            name = self._take()
            if _NAME.fullmatch(name) is None or len(name) > MAX_NAME:
                raise self._fail("expected a parameter name")
        return Param(name=name, type=type_text, indexed=indexed, components=components)

    def _arrays(self) -> str:
        text = ""
        while self._peek() == "[":
            self.at += 1
            size = ""
            if self._peek() != "]":
                size = self._take()
                if not size.isdigit():
                    raise self._fail("expected an array size")
            self._take("]")
            text += f"[{size}]"
        if _ARRAYS.fullmatch(text) is None:
            raise self._fail("an array size must be 1 to 999999")
        return text


def check_address(value: str, where: str) -> str:
    """``value`` as lowercase hex; AbiError unless it is 20 bytes of 0x hex."""
    lowered = value.strip().lower()
    if _ADDRESS.fullmatch(lowered) is None:
        raise AbiError(f"{where} must be 20 bytes of 0x hex, got {_shown(value)}")
    return lowered
