"""Read-only SQL over the chain tables: the statement a function sends, checked and
bounded before and while either engine runs it.

``prepare(sql, params, through_block, engine)`` checks the text and returns a
``Statement`` to run, or raises QueryRefused naming what it refuses:

- one statement (a second one after a ``;`` is refused, whatever it is), and a
  query: it starts with SELECT, WITH or VALUES (INSERT, PRAGMA, ATTACH, SET ... are
  refused by name here; a write hidden behind WITH is refused by the engine: the
  SQLite authorizer, PostgreSQL's READ ONLY transaction and its role);
- parameters only as bound values: ``?`` marks with a list, ``:name`` marks with a
  dict (never both), each value None, a bool, an int, a float or a str;
- ``through_block=N`` pins the statement: each block table it names is read
  through a common table expression of the same name holding only its rows at
  block numbers <= N (``WITH blocks AS NOT MATERIALIZED (SELECT * FROM
  main.blocks WHERE block_number <= N) <statement>``; a statement with its own
  WITH gets these first in its list). A pinned statement may name the block
  tables only by their plain names (``main.blocks`` would read past N), no other
  table of the block database (``chain`` moves with the head), nothing volatile
  (``random()``, ``now()``, 'now', the session, ``pg_*`` catalogs and statistics,
  ``information_schema``), and on PostgreSQL no function that runs SQL text or
  reads a table by name (``query_to_xml``, ``table_to_xml``, ``ts_stat`` ...). Its
  answer then depends on the rows at blocks <= N alone, and cannot change once N
  is final.

The tokenizer knows both engines' quoting: '...' strings, "..." identifiers,
comments (PostgreSQL's nest), SQLite's [...] and `...` identifiers, PostgreSQL's
E'...' strings, $tag$...$tag$ bodies and U&"..." identifiers. Each engine also
refuses a second statement itself (sqlite3 and asyncpg's extended protocol), so a
tokenizer mistake cannot let one through.

``QueryLimits`` bound what a statement may cost: rows, bytes (of the answer's
JSON) and wall time; ``RowBudget`` counts rows and bytes as they are fetched, so
fetching stops at the bound instead of reading everything first.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from blockx_chain.schema import BLOCK_TABLES, TABLES, Engine
from blockx_chain.store.errors import StoreError, TooManyRows

# The tables a statement may read: the block tables, and ``chain`` (the head and
# finalized heights, so a statement can anchor itself to them). Every other table
# of the block database (the ABI registry, the reorg log, the schema version) and
# any other table (a sink sharing the database) is refused.
BLOCK_TABLE_NAMES: Final = frozenset(t.name for t in BLOCK_TABLES)
QUERY_TABLES: Final = BLOCK_TABLE_NAMES | {"chain"}
# Tables of the block database that are no block table: a pinned statement names none.
_MOVING_TABLES: Final = frozenset(t.name for t in TABLES) - BLOCK_TABLE_NAMES | {"blockx_schema"}
# PostgreSQL functions that run SQL text or read a table named by a value: through
# them a pinned statement could read past its block.
_SQL_RUNNING: Final = frozenset(
    {
        "query_to_xml",
        "query_to_xml_and_xmlschema",
        "query_to_xmlschema",
        "cursor_to_xml",
        "table_to_xml",
        "table_to_xml_and_xmlschema",
        "schema_to_xml",
        "schema_to_xml_and_xmlschema",
        "database_to_xml",
        "database_to_xml_and_xmlschema",
        "ts_stat",
        "ts_rewrite",
        "dblink",
        "dblink_exec",
    }
)
# What makes an answer change though the rows at blocks <= N do not: the clock,
# chance, the session, the server's catalogs and statistics (every ``pg_*`` name,
# ``information_schema``) and SQLite's 'now'. A pinned statement names none of them.
_VOLATILE: Final = frozenset(
    {
        "random",
        "randomblob",
        "setseed",
        "now",
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "current_timestamp",
        "current_date",
        "current_time",
        "localtime",
        "localtimestamp",
        "current_setting",
        "current_user",
        "session_user",
        "current_schema",
        "current_database",
        "inet_server_addr",
        "version",
        "nextval",
        "currval",
        "lastval",
        "gen_random_uuid",
        "txid_current",
        "changes",
        "total_changes",
        "last_insert_rowid",
        "sqlite_version",
        "sqlite_source_id",
        "information_schema",
    }
)
_QUERY_WORDS: Final = frozenset({"select", "with", "values"})
MAX_SQL_CHARS: Final = 100_000
# The defaults of BLOCKDB_QUERY_MAX_BYTES, and of BLOCKDB_QUERY_TIMEOUT_MS where no
# CALL_DEADLINE_MS is read (CALL_DEADLINE_MS's own default).
DEFAULT_QUERY_MAX_BYTES: Final = 16 * 1024 * 1024
DEFAULT_QUERY_TIMEOUT_MS: Final = 5000
MAX_PARAMS: Final = 1000


class QueryRefused(StoreError):
    """The statement is refused as written (the caller's to change); the message
    names what was refused."""


class QueryTimedOut(StoreError):
    """The statement ran past its wall-time limit and was stopped."""


class QueryTooLarge(StoreError):
    """The answer would exceed the byte limit."""


class QueryLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one statement may cost: rows and bytes of its answer, and wall time."""

    max_rows: int
    max_bytes: int
    timeout_ms: int


class Statement(msgspec.Struct, frozen=True, kw_only=True):
    """A checked statement: ``sql`` for its engine, ``params`` its bound values
    (a tuple, or a dict for SQLite's ``:name`` marks), ``pinned`` its
    ``through_block``. A statement with a WITH of its own: ``with_end`` is where its
    WITH [RECURSIVE] ends (0: none), ``recursive`` whether it says RECURSIVE."""

    sql: str
    params: tuple[Any, ...] | dict[str, Any]
    pinned: int | None = None
    with_end: int = 0
    recursive: bool = False

    def with_tables(self, tables: str) -> str:
        """The statement with common tables ``tables`` (``name AS (...), ...``) first
        in its WITH list."""
        if not self.with_end:
            return f"WITH {tables} {self.sql}"
        head = "WITH RECURSIVE" if self.recursive else "WITH"
        return f"{head} {tables}, {self.sql[self.with_end :]}"

    def pinned_sql(self, schema: str) -> str:
        """The statement reading the block tables (of ``schema``) through common
        tables of their names holding only the rows at blocks <= its pin."""
        assert self.pinned is not None
        return self.with_tables(
            ", ".join(
                f"{t.name} AS NOT MATERIALIZED (SELECT * FROM {schema}.{t.name} "
                f"WHERE block_number <= {self.pinned})"
                for t in BLOCK_TABLES
            )
        )


def empty_tables() -> str:
    """Common tables named like the block tables, with their columns and no rows."""
    return ", ".join(
        f"{t.name}({', '.join(t.names)}) AS (SELECT {', '.join('NULL' for _ in t.names)} "
        "WHERE 1 = 0)"
        for t in BLOCK_TABLES
    )


class _Kind(enum.Enum):
    WORD = "word"
    QUOTED = "quoted"  # a quoted identifier
    UNICODE_QUOTED = "unicode quoted"  # PostgreSQL's U&"...": its name is not checked
    STRING = "string"
    MARK = "?"
    NAMED = ":name"
    NUMBERED = "$n"  # and SQLite's ?NNN, $name, @name: marks we refuse
    SEMICOLON = ";"
    DOT = "."
    OTHER = "other"


class _Token(msgspec.Struct, frozen=True):
    kind: _Kind
    value: str
    start: int
    end: int


_WORD_START: Final = re.compile(r"[A-Za-z_\u0080-\U0010ffff]")
_WORD: Final = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]*")
_DOLLAR_TAG: Final = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_DIGITS: Final = re.compile(r"\$[0-9]+")
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# SQLite's other parameter marks: ?NNN, $name, @name (and $NNN, @NNN).
_SQLITE_MARK: Final = re.compile(r"\?[0-9]+|[$@][A-Za-z0-9_]+")


def _closing(text: str, start: int, quote: str, what: str, *, backslash: bool = False) -> int:
    """The index after the quote closing what opens at ``start`` (a doubled quote
    is one quote character inside)."""
    i = start + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            raise QueryRefused(f"the SQL has an unterminated {what}")
        if backslash:
            slashes = 0
            k = j - 1
            while k >= start + 1 and text[k] == "\\":
                slashes += 1
                k -= 1
            if slashes % 2 == 1:
                i = j + 1
                continue
        if text.startswith(quote * 2, j):
            i = j + 2
            continue
        return j + 1


def _block_comment_end(text: str, start: int, *, nested: bool) -> int:
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("/*", i):
            depth = depth + 1 if nested or depth == 0 else depth
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise QueryRefused("the SQL has an unterminated /* comment")


def tokens(text: str, engine: Engine) -> list[_Token]:
    """The tokens of ``text`` (comments and blanks dropped); QueryRefused for an
    unterminated string, identifier or comment."""
    postgres = engine is Engine.POSTGRES
    out: list[_Token] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if text.startswith("/*", i):
            i = _block_comment_end(text, i, nested=postgres)
            continue
        start = i
        if c == "'":
            i = _closing(text, i, "'", "string")
            out.append(_Token(_Kind.STRING, text[start:i], start, i))
            continue
        if postgres and c in "eE" and text.startswith("'", i + 1):
            i = _closing(text, i + 1, "'", "string", backslash=True)
            out.append(_Token(_Kind.STRING, text[start:i], start, i))
            continue
        if postgres and c in "uU" and text.startswith("&", i + 1) and i + 2 < n:
            quote = text[i + 2]
            if quote in "'\"":
                i = _closing(text, i + 2, quote, "identifier" if quote == '"' else "string")
                kind = _Kind.UNICODE_QUOTED if quote == '"' else _Kind.STRING
                out.append(_Token(kind, text[start:i], start, i))
                continue
        if c == '"':
            i = _closing(text, i, '"', "quoted identifier")
            out.append(_Token(_Kind.QUOTED, text[start + 1 : i - 1].replace('""', '"'), start, i))
            continue
        if not postgres and c in "[`":
            close = "]" if c == "[" else "`"
            end = text.find(close, i + 1)
            if end < 0:
                raise QueryRefused(f"the SQL has an unterminated {c} identifier")
            i = end + 1
            out.append(_Token(_Kind.QUOTED, text[start + 1 : end], start, i))
            continue
        if c == "$" and postgres:
            tag = _DOLLAR_TAG.match(text, i)
            if tag is not None:
                end = text.find(tag.group(0), tag.end())
                if end < 0:
                    raise QueryRefused("the SQL has an unterminated $$ string")
                i = end + len(tag.group(0))
                out.append(_Token(_Kind.STRING, text[start:i], start, i))
                continue
            digits = _DIGITS.match(text, i)
            if digits is not None:
                i = digits.end()
                out.append(_Token(_Kind.NUMBERED, text[start:i], start, i))
                continue
        if not postgres and c in "?$@":
            mark = _SQLITE_MARK.match(text, i)
            if mark is not None:
                i = mark.end()
                out.append(_Token(_Kind.NUMBERED, mark.group(0), start, i))
                continue
        if c == "?":
            i += 1
            out.append(_Token(_Kind.MARK, "?", start, i))
            continue
        if c == ":":
            if text.startswith("::", i):
                i += 2
                out.append(_Token(_Kind.OTHER, "::", start, i))
                continue
            name = _NAME.match(text, i + 1)
            if name is not None:
                i = name.end()
                out.append(_Token(_Kind.NAMED, name.group(0), start, i))
                continue
        if c == ";":
            i += 1
            out.append(_Token(_Kind.SEMICOLON, ";", start, i))
            continue
        if c == ".":
            i += 1
            out.append(_Token(_Kind.DOT, ".", start, i))
            continue
        if _WORD_START.match(c):
            word = _WORD.match(text, i + 1)
            i = word.end() if word is not None else i + 1
            out.append(_Token(_Kind.WORD, text[start:i].lower(), start, i))
            continue
        if c.isdigit():
            while i < n and (text[i].isalnum() or text[i] in "._"):
                i += 1
            out.append(_Token(_Kind.OTHER, text[start:i], start, i))
            continue
        i += 1
        out.append(_Token(_Kind.OTHER, c, start, i))
    return out


def _excerpt(text: str, start: int) -> str:
    line = text[start:].strip().splitlines()[0] if text[start:].strip() else ""
    return line[:60] + ("..." if len(line) > 60 else "")


def _check_value(value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise QueryRefused(
            f"parameter {where} is {value}, beyond a 64-bit integer: pass a larger number "
            "as a str and CAST it in the SQL"
        )
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise QueryRefused(
        f"parameter {where} is a {type(value).__name__}: parameters are bound values "
        "(None, a bool, an int, a float or a str)"
    )


def prepare(sql: Any, params: Any, through_block: Any, engine: Engine) -> Statement:
    """The statement to run on ``engine``; QueryRefused naming what is refused."""
    if not isinstance(sql, str):
        raise QueryRefused(f"sql must be the text of one SELECT, got {type(sql).__name__}")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the SQL has {len(sql)} characters, more than {MAX_SQL_CHARS}")
    if through_block is not None and (
        not isinstance(through_block, int)
        or isinstance(through_block, bool)
        or not 0 <= through_block < 2**63
    ):
        raise QueryRefused(f"through_block must be a block number (int), got {through_block!r}")
    found = tokens(sql, engine)
    # Trailing semicolons end the statement; anything after one starts another.
    last = len(found)
    while last and found[last - 1].kind is _Kind.SEMICOLON:
        last -= 1
    body = found[:last]
    if not body:
        raise QueryRefused("the SQL holds no statement")
    for token in body:
        if token.kind is _Kind.SEMICOLON:
            rest = next((t for t in body if t.start > token.start), token)
            raise QueryRefused(
                "multiple statements are refused: io.blockdb_executor runs one SELECT "
                f"(a second statement starts at {_excerpt(sql, rest.start)!r})"
            )
    first = body[0]
    if first.kind is not _Kind.WORD or first.value not in _QUERY_WORDS:
        what = first.value.upper() if first.kind is _Kind.WORD else repr(first.value)
        raise QueryRefused(
            f"the {what} statement is refused: io.blockdb_executor runs one SELECT "
            "(or WITH ... SELECT, VALUES) over the chain tables"
        )
    text = sql[: body[-1].end]
    values = _bound(body, params)
    if through_block is not None:
        _check_pinnable(body, engine)
    if engine is Engine.POSTGRES:
        text = _numbered(text, body)
        if isinstance(values, dict):
            names = _named_order(body)
            values = tuple(values[name] for name in names)
    with_end, recursive = 0, False
    if body[0].value == "with":
        with_end = body[0].end
        if len(body) > 1 and body[1].kind is _Kind.WORD and body[1].value == "recursive":
            with_end, recursive = body[1].end, True
        # Numbering moved the text after the WITH, never the WITH itself.
    return Statement(
        sql=text, params=values, pinned=through_block, with_end=with_end, recursive=recursive
    )


def _bound(body: list[_Token], params: Any) -> tuple[Any, ...] | dict[str, Any]:
    marks = sum(1 for t in body if t.kind is _Kind.MARK)
    names = {t.value for t in body if t.kind is _Kind.NAMED}
    numbered = next((t for t in body if t.kind is _Kind.NUMBERED), None)
    if numbered is not None:
        raise QueryRefused(
            f"the parameter mark {numbered.value} is refused: mark parameters with ? "
            "(params a list) or :name (params a dict)"
        )
    if marks and names:
        raise QueryRefused("the SQL mixes ? and :name parameters: use one kind")
    if params is None:
        params = [] if not names else {}
    if isinstance(params, list | tuple):
        if names:
            raise QueryRefused("the SQL marks :name parameters: pass params as a dict")
        if len(params) != marks:
            raise QueryRefused(
                f"the SQL has {marks} ? parameter(s) and params holds {len(params)} value(s)"
            )
        if len(params) > MAX_PARAMS:
            raise QueryRefused(f"more than {MAX_PARAMS} parameters")
        return tuple(_check_value(v, f"{i + 1}") for i, v in enumerate(params))
    if isinstance(params, dict):
        if marks:
            raise QueryRefused("the SQL marks ? parameters: pass params as a list")
        keys = set(params)
        if keys != names:
            missing = ", ".join(sorted(str(k) for k in names - keys)) or "none"
            extra = ", ".join(sorted(str(k) for k in keys - names)) or "none"
            raise QueryRefused(
                f"params must name exactly the SQL's :name marks (missing: {missing}; "
                f"not in the SQL: {extra})"
            )
        return {k: _check_value(v, repr(k)) for k, v in params.items()}
    raise QueryRefused(
        f"params must be a list (for ? marks) or a dict (for :name marks), got "
        f"{type(params).__name__}: values are bound, never pasted into the SQL"
    )


def _named_order(body: list[_Token]) -> list[str]:
    order: list[str] = []
    for token in body:
        if token.kind is _Kind.NAMED and token.value not in order:
            order.append(token.value)
    return order


def _numbered(text: str, body: list[_Token]) -> str:
    """``?`` and ``:name`` as PostgreSQL's ``$1, $2 ...`` (one number per name)."""
    numbers: dict[str, int] = {}
    parts: list[str] = []
    at = 0
    marks = 0
    for token in body:
        if token.kind is _Kind.MARK:
            marks += 1
            number = marks
        elif token.kind is _Kind.NAMED:
            number = numbers.setdefault(token.value, len(numbers) + 1)
        else:
            continue
        parts.append(text[at : token.start])
        parts.append(f"${number}")
        at = token.end
    parts.append(text[at:])
    return "".join(parts)


def _name_of(token: _Token) -> str | None:
    if token.kind is _Kind.WORD:
        return token.value
    if token.kind is _Kind.QUOTED:
        return token.value
    return None


def _check_pinnable(body: list[_Token], engine: Engine) -> None:
    for i, token in enumerate(body):
        after_dot = i > 0 and body[i - 1].kind is _Kind.DOT
        if after_dot and (
            token.kind is _Kind.UNICODE_QUOTED or _name_of(token) in BLOCK_TABLE_NAMES
        ):
            qualified = f"{_name_of(body[i - 2]) if i > 1 else ''}.{_name_of(token) or '?'}"
            raise QueryRefused(
                f"a pinned query (through_block) names the chain tables by their plain names: "
                f"{qualified} would read past through_block"
            )
        name = _name_of(token)
        if name in _MOVING_TABLES and not after_dot:
            raise QueryRefused(
                f"a pinned query (through_block) reads only the block tables: {name} changes "
                "as the chain moves"
            )
        if token.kind is _Kind.WORD and (token.value in _VOLATILE or token.value.startswith("pg_")):
            raise QueryRefused(
                f"a pinned query (through_block) may not use {token.value}: its answer "
                "would change though the blocks through through_block do not"
            )
        if token.kind is _Kind.STRING and token.value.strip("'").lower() == "now":
            raise QueryRefused(
                "a pinned query (through_block) may not read the clock ('now'): its answer "
                "would change though the blocks through through_block do not"
            )
        if (
            engine is Engine.POSTGRES
            and token.kind is _Kind.WORD
            and token.value in _SQL_RUNNING
            and i + 1 < len(body)
            and body[i + 1].value == "("
        ):
            raise QueryRefused(
                f"a pinned query (through_block) may not call {token.value}(): it reads "
                "tables by name, past through_block"
            )


# The JSON size of a row, as the answer will carry it.
_encode: Final = msgspec.json.Encoder().encode


class RowBudget:
    """Counts the rows and bytes of an answer as they are fetched."""

    def __init__(self, limits: QueryLimits) -> None:
        self.limits = limits
        self.rows: list[dict[str, Any]] = []
        self.bytes = 2

    def add(self, row: Mapping[str, Any]) -> None:
        """Keep one row; TooManyRows or QueryTooLarge past a bound."""
        if len(self.rows) >= self.limits.max_rows:
            raise TooManyRows(
                f"query returned more than {self.limits.max_rows} rows (BLOCKDB_MAX_ROWS): "
                "aggregate in SQL, add a LIMIT or narrow the range"
            )
        kept = dict(row)
        try:
            size = len(_encode(kept)) + 1
        except (TypeError, ValueError, OverflowError) as exc:
            raise QueryRefused(
                f"a column of the answer cannot be carried as JSON ({exc}): cast it to text"
            ) from None
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise QueryTooLarge(
                f"query answer is larger than {self.limits.max_bytes} bytes "
                "(BLOCKDB_QUERY_MAX_BYTES): select fewer columns or rows, or aggregate in SQL"
            )
        self.rows.append(kept)


def timed_out(limits: QueryLimits) -> QueryTimedOut:
    return QueryTimedOut(
        f"query ran longer than {limits.timeout_ms} ms (BLOCKDB_QUERY_TIMEOUT_MS) and was "
        "stopped: narrow the range or aggregate less"
    )
