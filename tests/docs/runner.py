"""Runs one doc block in a scratch directory and judges it: exit 0, no traceback (but
one its ``text output`` block shows: a user's function's, as ``blockx replay`` prints
it), and the output its ``text output`` block shows."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from docs.blocks import Block, output_mismatch

PYTHON_BLOCK: Final = Path(__file__).with_name("python_block.py")
TRACEBACK: Final = "Traceback (most recent call last)"
# One line per document run, printed in the terminal summary (tests/docs/conftest.py).
TALLY_KEY: Final = pytest.StashKey[list[str]]()


@dataclass(frozen=True, kw_only=True)
class BlockRun:
    returncode: int | None  # None: killed at its timeout
    output: str  # stdout and stderr, interleaved as a terminal shows them


def _command(block: Block, cwd: Path) -> list[str]:
    name = f".{Path(block.source).stem}-{block.line}"
    if block.language == "python":
        script = cwd / f"{name}.py"
        script.write_text(block.code)
        return [sys.executable, str(PYTHON_BLOCK), str(script)]
    script = cwd / f"{name}.sh"
    script.write_text(block.code)
    return ["bash", "-e", "-o", "pipefail", str(script)]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_block(block: Block, *, cwd: Path, env: dict[str, str], timeout_s: float) -> BlockRun:
    """Run ``block`` in its own process group, killed whole at ``timeout_s`` and after
    it ends (whatever it left in the background goes with it)."""
    proc = subprocess.Popen(
        _command(block, cwd),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",  # a block that prints bytes fails on its output, not on decoding
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        output, _ = proc.communicate()
        return BlockRun(returncode=None, output=output)
    finally:
        _kill_group(proc.pid)
    return BlockRun(returncode=proc.returncode, output=output)


def failure(block: Block, run: BlockRun, *, timeout_s: float) -> str | None:
    """None when the block did what its doc says; else a report naming the document,
    the block's line, what went wrong, the block and its output."""
    if run.returncode is None:
        what = f"did not finish in {timeout_s:g} s (killed)"
    elif run.returncode != 0:
        what = f"exited {run.returncode}"
    elif TRACEBACK in run.output and TRACEBACK not in (block.expected_output or ""):
        # A traceback its output block shows is the user's function's (blockx replay).
        what = "printed a traceback"
    elif block.expected_output is not None:
        mismatch = output_mismatch(block.expected_output, run.output)
        if mismatch is None:
            return None
        what = f"printed other output than its ```text output block: {mismatch}"
    else:
        return None
    return (
        f"{block.where}: the ```{block.language} block {what}\n"
        f"--- block\n{block.code.rstrip()}\n--- output\n{run.output.rstrip()}\n---"
    )
