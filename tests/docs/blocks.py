"""The fenced code blocks of a Markdown document, read the way the docs test runs them.

The conventions (docs/development.md, "Docs that run"):

* ```` ```python ````, ```` ```bash ```` and ```` ```sh ```` blocks run: a shell block
  with ``bash -e -o pipefail``, a Python block as a script.
* ```` ```bash skip: <reason> ```` (or ``python skip:`` / ``sh skip:``) does not run; the
  reason is required, since a skip nobody can judge hides a doc that no longer works.
* ```` ```text output ```` after a block that runs is what that block prints, matched
  line by line, with ``...`` standing for any text on a line.
* Every other known language (``text``, ``toml``, ``json``, ``mermaid``, ...) and a bare
  fence are shown, not run. An unknown language is an error: a misspelt ``pyhton``
  would otherwise never run.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

RUN_LANGUAGES: Final = frozenset({"python", "bash", "sh"})
SHOWN_LANGUAGES: Final = frozenset(
    {"", "text", "toml", "json", "mermaid", "proto", "sql", "yaml", "ini", "console", "diff"}
)
SKIP_PREFIX: Final = "skip:"
OUTPUT_ATTRIBUTE: Final = "output"
ANY_TEXT: Final = "..."

# CommonMark: an opening fence is three or more backticks after at most three spaces
# (list items nest deeper, so any indentation is read as the fence's own).
_OPENING = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,})(?P<info>[^`]*)$")


def documents(root: Path) -> list[Path]:
    """The documents whose blocks run: README.md and docs/*.md, in that order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


class Mode(enum.Enum):
    RUN = "run"
    SKIP = "skip"
    SHOWN = "shown"  # another language, or a text output already attached to its block


class DocBlockError(ValueError):
    """A block that breaks the conventions; the message names the file and line."""


@dataclass(frozen=True, kw_only=True)
class Block:
    source: str  # the document, as the failure messages name it
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    mode: Mode
    skip_reason: str = ""
    expected_output: str | None = None  # the text output block after it, if any

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(frozen=True)
class _Fence:
    line: int
    info: str
    code: str


def _fences(text: str, source: str) -> list[_Fence]:
    lines = text.split("\n")
    fences: list[_Fence] = []
    i = 0
    while i < len(lines):
        opening = _OPENING.match(lines[i])
        if opening is None:
            if lines[i].lstrip(" ").startswith("```"):
                raise DocBlockError(
                    f"{source}:{i + 1}: a fence's info string cannot hold a backtick "
                    "(Markdown then reads no fence): reword it"
                )
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^[ ]*`{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            j += 1
        if j == len(lines):
            raise DocBlockError(f"{source}:{i + 1}: the fence opened here is never closed")
        code = "\n".join(body)
        fences.append(_Fence(line=i + 1, info=opening["info"].strip(), code=code + "\n"))
        i = j + 1
    return fences


def _read_fence(fence: _Fence, source: str) -> Block:
    where = f"{source}:{fence.line}"
    language, _, rest = fence.info.partition(" ")
    language, rest = language.strip().lower(), rest.strip()
    if language in RUN_LANGUAGES:
        if not rest:
            return Block(
                source=source, line=fence.line, language=language, code=fence.code, mode=Mode.RUN
            )
        if rest.startswith(SKIP_PREFIX):
            reason = rest.removeprefix(SKIP_PREFIX).strip()
            if not reason:
                raise DocBlockError(
                    f"{where}: ```{language} skip: needs a reason after the colon "
                    "(what the block needs that a dev up cluster has not)"
                )
            return Block(
                source=source,
                line=fence.line,
                language=language,
                code=fence.code,
                mode=Mode.SKIP,
                skip_reason=reason,
            )
        if rest.startswith("skip"):
            raise DocBlockError(f"{where}: write `skip: <reason>`, with a colon; got {rest!r}")
        raise DocBlockError(
            f"{where}: ```{language} takes nothing or `skip: <reason>` after it; got {rest!r}"
        )
    if language in SHOWN_LANGUAGES:
        if rest.startswith("skip"):
            raise DocBlockError(
                f"{where}: only python, bash and sh blocks run, so ```{fence.info} "
                "has nothing to skip; drop the skip"
            )
        return Block(
            source=source, line=fence.line, language=language, code=fence.code, mode=Mode.SHOWN
        )
    raise DocBlockError(
        f"{where}: unknown language {language!r}; blocks that run are "
        f"{', '.join(sorted(RUN_LANGUAGES))}, and those shown are "
        f"{', '.join(sorted(SHOWN_LANGUAGES - {''}))} or a bare fence"
    )


def _is_output(fence: _Fence) -> bool:
    language, _, rest = fence.info.partition(" ")
    return language.strip().lower() == "text" and rest.strip() == OUTPUT_ATTRIBUTE


def parse_blocks(text: str, source: str) -> list[Block]:
    """Every fenced block of ``text`` in order; a ``text output`` block is attached to
    the block before it, which must be one that runs (nothing would check it else)."""
    blocks: list[Block] = []
    for fence in _fences(text, source):
        if not _is_output(fence):
            blocks.append(_read_fence(fence, source))
            continue
        where = f"{source}:{fence.line}"
        before = blocks[-1] if blocks else None
        if before is None or before.mode is not Mode.RUN:
            what = "nothing" if before is None else f"a {before.mode.value} block ({before.where})"
            raise DocBlockError(
                f"{where}: ```text output follows {what}: only a block that runs has its "
                "output checked; fence it ```text"
            )
        if before.expected_output is not None:
            raise DocBlockError(f"{where}: a second ```text output for {before.where}")
        blocks[-1] = Block(
            source=before.source,
            line=before.line,
            language=before.language,
            code=before.code,
            mode=before.mode,
            expected_output=fence.code,
        )
    return blocks


def _trimmed_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split(ANY_TEXT)))


def output_mismatch(expected: str, actual: str) -> str | None:
    """None when ``actual`` matches ``expected`` line for line (trailing spaces and
    blank lines at either end aside), ``...`` standing for any text on its line;
    otherwise one line saying where they part."""
    want, got = _trimmed_lines(expected), _trimmed_lines(actual)
    for number, (pattern, line) in enumerate(zip(want, got, strict=False), start=1):
        if not _line_pattern(pattern).fullmatch(line):
            return f"output line {number}: expected {pattern!r}, got {line!r}"
    if len(want) != len(got):
        return (
            f"expected {len(want)} lines of output, got {len(got)}"
            + (f"; the first extra: {got[len(want)]!r}" if len(got) > len(want) else "")
            + (f"; the first missing: {want[len(got)]!r}" if len(want) > len(got) else "")
        )
    return None


@dataclass(frozen=True, kw_only=True)
class Tally:
    """How many blocks of one document run, are skipped, and have their output checked."""

    source: str
    run: int
    skipped: int
    checked: int

    def line(self) -> str:
        checked = f"{self.checked} output checked"
        return f"{self.source}: {self.run} run ({checked}), {self.skipped} skipped"


def tally(source: str, blocks: list[Block]) -> Tally:
    return Tally(
        source=source,
        run=sum(b.mode is Mode.RUN for b in blocks),
        skipped=sum(b.mode is Mode.SKIP for b in blocks),
        checked=sum(b.expected_output is not None for b in blocks),
    )
