"""The conventions of doc blocks that run, without a cluster: the fence parser, the
output matcher with ``...``, the Python block driver, the runner's verdicts, and the
tally of the repository's own documents."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from docs.blocks import (
    Block,
    DocBlockError,
    Mode,
    documents,
    output_mismatch,
    parse_blocks,
    tally,
)
from docs.runner import BlockRun, failure, run_block

ROOT = Path(__file__).resolve().parents[2]

# The blocks the docs run today (27, 14 of them with their output checked), so the
# test cannot pass on a parser that finds nothing or on docs fenced `skip:`
# wholesale. Raise them as blocks are added; lower them only with a reason.
RUN_FLOOR = 27
CHECKED_FLOOR = 14


def _doc(text: str) -> str:
    return textwrap.dedent(text).replace("'''", "```")


def test_run_skip_and_shown_blocks_are_told_apart() -> None:
    blocks = parse_blocks(
        _doc("""\
            # Title
            '''python
            print("hi")
            '''
            '''bash skip: needs PostgreSQL
            psql -c 'select 1'
            '''
            '''sh
            echo sh
            '''
            '''toml
            A = 1
            '''
            '''
            usage: blockx ...
            '''
            """),
        "doc.md",
    )
    assert [(b.line, b.language, b.mode, b.skip_reason) for b in blocks] == [
        (2, "python", Mode.RUN, ""),
        (5, "bash", Mode.SKIP, "needs PostgreSQL"),
        (8, "sh", Mode.RUN, ""),
        (11, "toml", Mode.SHOWN, ""),
        (14, "", Mode.SHOWN, ""),
    ]
    assert blocks[0].code == 'print("hi")\n'
    assert blocks[1].where == "doc.md:5"


def test_a_fence_inside_a_list_item_loses_its_indentation() -> None:
    (block,) = parse_blocks(
        _doc("""\
            - run this:

              '''bash
              echo one
                echo two
              '''
            """),
        "doc.md",
    )
    assert (block.line, block.code) == (3, "echo one\n  echo two\n")


def test_a_longer_fence_holds_a_shorter_one() -> None:
    (block,) = parse_blocks("````text\n```python\nx\n```\n````\n", "doc.md")
    assert (block.mode, block.code) == (Mode.SHOWN, "```python\nx\n```\n")


def test_text_output_belongs_to_the_block_before_it() -> None:
    blocks = parse_blocks(
        _doc("""\
            '''bash
            echo hi
            '''
            It prints:
            '''text output
            hi
            '''
            """),
        "doc.md",
    )
    assert blocks == [
        Block(
            source="doc.md",
            line=1,
            language="bash",
            code="echo hi\n",
            mode=Mode.RUN,
            expected_output="hi\n",
        )
    ]
    assert tally("doc.md", blocks).line() == "doc.md: 1 run (1 output checked), 0 skipped"


BROKEN = [
    # (document, what the one-line error must say)
    ("'''bash skip:\nx\n'''\n", "doc.md:1: ```bash skip: needs a reason"),
    ("'''python skip:   \nx\n'''\n", "doc.md:1: ```python skip: needs a reason"),
    ("'''bash skip because slow\nx\n'''\n", "doc.md:1: write `skip: <reason>`, with a colon"),
    ("'''bash -x\nx\n'''\n", "doc.md:1: ```bash takes nothing or `skip: <reason>`"),
    ("'''pyhton\nx\n'''\n", "doc.md:1: unknown language 'pyhton'"),
    ("'''toml skip: no reason to\nx\n'''\n", "doc.md:1: only python, bash and sh blocks run"),
    ("text\n'''bash\nx\n", "doc.md:2: the fence opened here is never closed"),
    (
        "'''bash skip: needs `psql`\nx\n'''\n",
        "doc.md:1: a fence's info string cannot hold a backtick",
    ),
    ("'''text output\nx\n'''\n", "doc.md:1: ```text output follows nothing"),
    (
        "'''bash skip: slow\nx\n'''\n'''text output\nx\n'''\n",
        "doc.md:4: ```text output follows a skip block (doc.md:1)",
    ),
    ("'''json\n{}\n'''\n'''text output\nx\n'''\n", "follows a shown block (doc.md:1)"),
    (
        "'''bash\nx\n'''\n'''text output\nx\n'''\n'''text output\ny\n'''\n",
        "doc.md:7: a second ```text output for doc.md:1",
    ),
]


@pytest.mark.parametrize(("text", "message"), BROKEN)
def test_a_block_that_breaks_the_conventions_is_named(text: str, message: str) -> None:
    with pytest.raises(DocBlockError) as raised:
        parse_blocks(text.replace("'''", "```"), "doc.md")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


MATCHES = [
    # (expected, actual, None or the start of the mismatch)
    ("hi\n", "hi\n", None),
    ("hi\n", "\n\nhi   \n\n", None),
    ("task ... SUCCEEDED\n", "task t-41 SUCCEEDED\n", None),
    ("task ... SUCCEEDED\n", "task  SUCCEEDED\n", None),
    ("...\n", "anything at all\n", None),
    ("a ... b ... c\n", "a 1 b 2 c\n", None),
    ("cost (wei): 1.5*x\n", "cost (wei): 1.5*x\n", None),
    ("cost (wei): 1.5*x\n", "cost (wei): 1x5*x\n", "output line 1: expected"),
    ("task ... SUCCEEDED\n", "task t-41 FAILED\n", "output line 1: expected"),
    ("...\n", "one\ntwo\n", "expected 1 lines of output, got 2; the first extra: 'two'"),
    ("one\ntwo\n", "one\n", "expected 2 lines of output, got 1; the first missing: 'two'"),
    ("one\n...\nthree\n", "one\n2\n3\nthree\n", "output line 3: expected 'three', got '3'"),
]


@pytest.mark.parametrize(("expected", "actual", "mismatch"), MATCHES)
def test_output_matches_line_by_line_with_dots_for_any_text(
    expected: str, actual: str, mismatch: str | None
) -> None:
    said = output_mismatch(expected, actual)
    if mismatch is None:
        assert said is None
    else:
        assert said is not None
        assert said.startswith(mismatch), said


def _block(language: str, code: str, expected_output: str | None = None) -> Block:
    return Block(
        source="doc.md",
        line=7,
        language=language,
        code=textwrap.dedent(code),
        mode=Mode.RUN,
        expected_output=expected_output,
    )


def _judge(block: Block, tmp_path: Path, timeout_s: float = 60) -> tuple[BlockRun, str | None]:
    run = run_block(block, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout_s=timeout_s)
    return run, failure(block, run, timeout_s=timeout_s)


def test_a_python_block_with_top_level_await_runs_in_asyncio_run(tmp_path: Path) -> None:
    block = _block(
        "python",
        """\
        import asyncio
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            print("awaited", __name__)
        """,
        expected_output="awaited __main__\n",
    )
    run, failed = _judge(block, tmp_path)
    assert failed is None, failed
    assert run.returncode == 0


def test_a_python_block_that_calls_asyncio_run_itself_runs_as_written(tmp_path: Path) -> None:
    block = _block(
        "python",
        """\
        import asyncio

        async def main():
            print("ran")

        asyncio.run(main())
        """,
        expected_output="ran\n",
    )
    assert _judge(block, tmp_path)[1] is None


def test_a_traceback_fails_the_block_even_when_it_exits_0(tmp_path: Path) -> None:
    block = _block(
        "python",
        """\
        import traceback
        try:
            1 / 0
        except ZeroDivisionError:
            traceback.print_exc()
        """,
    )
    run, failed = _judge(block, tmp_path)
    assert run.returncode == 0
    assert failed is not None
    assert failed.startswith("doc.md:7: the ```python block printed a")


def test_a_traceback_its_output_block_shows_passes(tmp_path: Path) -> None:
    # What blockx replay prints: the user's function's traceback, shown on purpose.
    block = _block(
        "python",
        """\
        print("Traceback (most recent call last):")
        print('  File "chain.py", line 27, in token_volume')
        """,
        expected_output='Traceback (most recent call last):\n  File "chain.py", line ...\n',
    )
    assert _judge(block, tmp_path)[1] is None


def test_a_failing_shell_line_fails_the_block_though_the_last_succeeds(tmp_path: Path) -> None:
    block = _block("bash", "false | cat\necho after\n")
    run, failed = _judge(block, tmp_path)
    assert run.returncode == 1
    assert failed is not None
    assert failed.splitlines()[0] == "doc.md:7: the ```bash block exited 1"
    assert "--- block\nfalse | cat\necho after\n--- output" in failed


def test_a_failing_python_block_reports_its_own_line(tmp_path: Path) -> None:
    block = _block("python", "x = 1\nraise SystemExit(f'bad {x}')\n")
    run, failed = _judge(block, tmp_path)
    assert run.returncode == 1
    assert run.output == "bad 1\n"
    assert failed is not None
    assert failed.startswith("doc.md:7: the ```python block exited 1")


def test_other_output_than_the_doc_shows_fails_the_block(tmp_path: Path) -> None:
    block = _block("sh", "echo task t-1 FAILED\n", expected_output="task ... SUCCEEDED\n")
    failed = _judge(block, tmp_path)[1]
    assert failed is not None
    assert "printed other output than its ```text output block: output line 1" in failed


def test_output_that_is_not_utf8_is_judged_not_fatal(tmp_path: Path) -> None:
    block = _block("bash", "printf 'caf\\xe9\\n'\n", expected_output="café\n")
    run, failed = _judge(block, tmp_path)
    assert run.output == "caf\ufffd\n"
    assert failed is not None
    assert "output line 1: expected 'café', got 'caf\ufffd'" in failed


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # dead, waiting for init to reap it


def test_a_hung_block_is_killed_with_its_children_and_named(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    block = _block("bash", f"sleep 600 &\necho $! > {pid_file}\nsleep 600\n")
    run, failed = _judge(block, tmp_path, timeout_s=1)
    assert run.returncode is None
    assert failed is not None
    assert failed.startswith("doc.md:7: the ```bash block did not finish in 1 s (killed)")
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while not _gone(child):
        assert time.monotonic() < deadline, f"the block's background child {child} lives on"
        time.sleep(0.05)


def test_every_document_follows_the_conventions_and_enough_of_them_run() -> None:
    """The whole docs parse (a bad fence fails here, with no cluster), and the number of
    blocks that run stays above what was measured."""
    tallies = []
    for path in documents(ROOT):
        blocks = parse_blocks(path.read_text(), str(path.relative_to(ROOT)))
        tallies.append(tally(str(path.relative_to(ROOT)), blocks))
    print("\n".join(t.line() for t in tallies))
    assert len(tallies) > 2
    assert tallies[0].source == "README.md"
    assert sum(t.run for t in tallies) >= RUN_FLOOR
    assert sum(t.checked for t in tallies) >= CHECKED_FLOOR
