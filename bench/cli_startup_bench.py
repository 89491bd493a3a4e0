"""CLI start-up benchmark: ``blockx`` beside a minimal two-command Typer + rich app.

Run: uv run python bench/cli_startup_bench.py [--runs 15] [--blockx .venv/bin/blockx]

The peer is written by the benchmark into a temporary directory: a Typer app with
rich markup, a ``--version`` option, and two commands (``hello NAME`` and ``bye``)
that print through a rich ``Console``, the shape of a Typer tutorial app. It runs
on this interpreter (``sys.executable``), so Typer and rich cost it what they cost
``blockx``.

Every sample is a fresh process, timed wall clock from spawn to exit, stdout and
stderr to a pipe. The kinds are alternated within each round (drift of a shared
machine hits all alike); each figure is the median of ``--runs`` rounds, with the
best beside it. Pairs (goal: ratio <= 1.5):

* ``blockx --version`` / ``peer --version``;
* ``blockx workers --help`` / ``peer hello --help`` (a command's help);
* ``blockx chain ingest --help`` and ``blockx backfill --help`` / ``peer hello --help``;
* ``blockx chain ingest`` and ``blockx backfill`` run to their first failure, each
  against ``peer bye`` (a command that runs): ingest with a node that refuses the
  connection (``--rpc http://127.0.0.1:1``: exit 3 once it has dialled the node,
  its first I/O), backfill with a block database that is not there (exit 3 once its
  flags are read, its job spec is built and the block database is looked for).
  That is start-up with every module the run imports before its first I/O, plus
  that failing I/O; the ``--help`` pairs are start-up without the run's own work;
* ``blockx --help`` (every command listed) / ``peer --help``.

``blockx`` is the console script as a user runs it (``--blockx``, default the
``blockx`` beside this interpreter); ``python -m blockx_cli`` is measured beside it
for ``--version``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER = '''\
import typer
from rich.console import Console

app = typer.Typer(rich_markup_mode="rich", no_args_is_help=True)
console = Console()


def _version(value: bool) -> None:
    if value:
        console.print("peer 0.1.0")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """A minimal two-command app."""


@app.command()
def hello(name: str = typer.Argument("world", help="Who to greet.")) -> None:
    """Say hello."""
    console.print(f"hello [bold]{name}[/]")


@app.command()
def bye() -> None:
    """Say goodbye."""
    console.print("bye")


if __name__ == "__main__":
    app()
'''


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    return time.perf_counter() - started, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=15)
    default_blockx = Path(sys.executable).parent / "blockx"
    parser.add_argument("--blockx", type=Path, default=default_blockx)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp:
        peer = Path(tmp) / "peer_app.py"
        peer.write_text(PEER)
        missing_db = f"sqlite:///{tmp}/no-such-dir/blocks.db"
        ingest_db = f"sqlite:///{tmp}/ingest.db"
        # An installed blockx has its bytecode cached (pip and uv write it, or the
        # first run does); a PYTHONDONTWRITEBYTECODE of this shell would make every
        # run compile the workspace's sources again, which no user pays.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("BLOCKX_", "BLOCKDB_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env |= {"COLUMNS": "100", "HOME": tmp}  # no dev.toml of a running `dev up`
        py, bx = [sys.executable], [str(args.blockx)]
        kinds: dict[str, list[str]] = {
            "peer --version": [*py, str(peer), "--version"],
            "peer hello --help": [*py, str(peer), "hello", "--help"],
            "peer bye": [*py, str(peer), "bye"],
            "peer --help": [*py, str(peer), "--help"],
            "blockx --version": [*bx, "--version"],
            "python -m blockx_cli --version": [*py, "-m", "blockx_cli", "--version"],
            "blockx workers --help": [*bx, "workers", "--help"],
            "blockx chain ingest --help": [*bx, "chain", "ingest", "--help"],
            "blockx backfill --help": [*bx, "backfill", "--help"],
            "blockx --help": [*bx, "--help"],
            "blockx chain ingest (node refused)": [
                *bx,
                *f"chain ingest --rpc http://127.0.0.1:1 --db {ingest_db} --to 10".split(),
            ],
            "blockx backfill (no database)": [
                *bx,
                *["--bundle-coordinator", "127.0.0.1:1"],
                *[
                    "backfill",
                    "--function",
                    "f",
                    "--source-table",
                    "logs",
                    "--from",
                    "0",
                    "--to",
                    "10",
                ],
                *f"--sink-table out --db {missing_db} --sink-db {missing_db}".split(),
            ],
        }
        samples: dict[str, list[float]] = {k: [] for k in kinds}
        codes: dict[str, set[int]] = {k: set() for k in kinds}
        for argv in kinds.values():  # warm the page cache and the .pyc files
            _time(argv, env)
        for _ in range(args.runs):
            for kind, argv in kinds.items():
                seconds, code = _time(argv, env)
                samples[kind].append(seconds)
                codes[kind].add(code)

    median = {k: statistics.median(v) for k, v in samples.items()}
    best = {k: min(v) for k, v in samples.items()}
    pairs = {
        "blockx --version": "peer --version",
        "python -m blockx_cli --version": "peer --version",
        "blockx workers --help": "peer hello --help",
        "blockx chain ingest --help": "peer hello --help",
        "blockx backfill --help": "peer hello --help",
        "blockx chain ingest (node refused)": "peer bye",
        "blockx backfill (no database)": "peer bye",
        "blockx --help": "peer --help",
    }
    print(f"{'command':<38} {'median s':>9} {'best s':>7} {'exit':>5}  ratio (median, best)")
    for kind in kinds:
        line = f"{kind:<38} {median[kind]:>9.3f} {best[kind]:>7.3f} {sorted(codes[kind])!s:>5}"
        if kind in pairs:
            peer_kind = pairs[kind]
            line += (
                f"  {median[kind] / median[peer_kind]:.2f}x, {best[kind] / best[peer_kind]:.2f}x"
                f" of {peer_kind}"
            )
        print(line)
    summary = {
        "runs": args.runs,
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "best_s": {k: round(v, 4) for k, v in best.items()},
        "ratio_median": {k: round(median[k] / median[p], 3) for k, p in pairs.items()},
        "goal": "<= 1.5",
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
