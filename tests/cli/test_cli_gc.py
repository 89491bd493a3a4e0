"""``blockx`` defers cyclic garbage collection while it starts and restores it when
a command's work starts: a short command pays no collector passes over the modules
it loads, and a long one collects cycles as any Python program does."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from blockx_cli.launch import START_UP_GC_YOUNG, collect_cycles

# Runs ``blockx ARGV`` as the console script does and reports the collector's
# settings when the command's work starts and at exit.
PROBE = """\
import gc, json, sys
fresh = list(gc.get_threshold())  # the interpreter's own, before blockx's
from blockx_cli import launch
seen = [{"fresh": fresh}]
restore = launch.collect_cycles

def spy():
    seen.append({"before": gc.get_threshold()})
    restore()
    seen.append({"after": gc.get_threshold(), "frozen": gc.get_freeze_count()})

launch.collect_cycles = spy
sys.argv = ["blockx", *json.loads(sys.argv[1])]
try:
    launch.main()
except SystemExit:
    pass
sys.stderr.write("\\nSEEN " + json.dumps(seen) + "\\n")
"""


def _seen(argv: list[str]) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
        check=False,
    )
    line = done.stderr.rsplit("SEEN ", 1)[-1]
    seen: list[dict[str, object]] = json.loads(line)
    return seen


def test_a_command_collects_cycles_again_once_its_work_starts(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path}/no-such-dir/sink.db"
    first, *seen = _seen(["jobs", "--sink-db", missing])
    fresh = first["fresh"]
    assert isinstance(fresh, list)
    young, older = fresh[0], fresh[1:]
    assert seen == [
        {"before": [START_UP_GC_YOUNG, *older]},
        {"after": [young, *older], "frozen": seen[1]["frozen"]},
    ]
    # The start-up's objects (the modules, typer's options) left the passes.
    frozen = seen[1]["frozen"]
    assert isinstance(frozen, int)
    assert frozen > 10_000


def test_help_never_starts_work() -> None:
    assert _seen(["jobs", "--help"])[1:] == []


def test_a_command_run_inside_another_program_leaves_its_collector_alone() -> None:
    """Without ``blockx``'s entry point (a CliRunner in a test, say), nothing was
    deferred and nothing is changed."""
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    collect_cycles()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)
