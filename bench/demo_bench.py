"""Demo benchmark: ``blockx demo``'s wall time and stages, and ``blockx dev up``'s
time to ready, over several runs.

Run: uv run python bench/demo_bench.py [--runs 3] [--dev-up-runs 3] [--cold]
     [--blockx PATH]

Each run is a new process, as a newcomer types it, timed from its spawn here to its
exit (the CLI's imports included), on the host as it is: the load average before
and after each run is printed with it, since the machine may be shared.

* ``blockx demo`` (``COLUMNS=200``): the wall time, and what the demo prints of
  itself: each stage's time (the figures table), when the cluster served after its
  start, the generation's transactions/s, the stop, ``done in``.
* ``blockx dev up`` (a fresh ``HOME``, no BlockX variables): the time to each of
  its progress lines (etcd, anvil, each process serving, the chain fed), to the
  banner, and to ``Press Ctrl-C to stop.`` (ready, after the smoke task); then
  Ctrl-C and the time it takes to stop.

``--cold`` drops the page cache (as root: ``sync``, then 3 to
``/proc/sys/vm/drop_caches``) before each run, to come closer to a fresh machine
(the binaries and the code read from disk again). ``--blockx`` runs another
checkout's ``blockx`` (its ``.venv/bin/blockx``), to compare two versions on the
same machine; it runs from that checkout's root.

Prints one table per command (median, min, max over the runs) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# What a fresh shell has none of.
SHELL_VARIABLES = ("BLOCKX_", "ETCD_", "PROXY_", "FUNCTIONS_DIR", "XDG_CONFIG", "CHAIN_RPC_URL")
READY_LINE = "Press Ctrl-C to stop."
_STAGE = re.compile(r"│ stage: ([a-z ]+?) +│ +(\d+\.\d) s │")
_SERVING = re.compile(r"│ cluster serving, from its start +│ +(\d+\.\d) s │")
_TX_RATE = re.compile(r"^  [\d,]+ transactions, ([\d,]+) tx/s", re.MULTILINE)
_STOPPED = re.compile(r"stopped in (\d+\.\d) s")
_DONE = re.compile(r"done in (\d+\.\d) s")
# A progress line of dev up: its own clock, then the step.
_PROGRESS = re.compile(r"^ +\d+\.\d s  (.+)$")


def _shell_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SHELL_VARIABLES)}
    return {**env, "HOME": str(home), "COLUMNS": "200"}


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_demo(blockx: str, cwd: Path) -> dict[str, Any]:
    load_before = _load()
    started = time.monotonic()
    done = subprocess.run(
        [blockx, "demo"],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - started
    out = done.stdout
    if done.returncode != 0:
        print(out[-3000:] + done.stderr[-2000:], file=sys.stderr)
    figures: dict[str, Any] = {
        "exit": done.returncode,
        "wall_s": round(wall, 2),
        "load_before": load_before,
        "load_after": _load(),
    }
    figures.update({f"stage: {name}": float(s) for name, s in _STAGE.findall(out)})
    for key, pattern in (
        ("cluster serving", _SERVING),
        ("stop", _STOPPED),
        ("done in", _DONE),
    ):
        found = pattern.search(out)
        if found:
            figures[key] = float(found[1])
    rate = _TX_RATE.search(out)
    if rate:
        figures["tx/s"] = int(rate[1].replace(",", ""))
    return figures


def run_dev_up(blockx: str, cwd: Path) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="demo-bench-home-"))
    load_before = _load()
    started = time.monotonic()
    proc = subprocess.Popen(
        [blockx, "dev", "up"],
        cwd=cwd,
        env=_shell_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    figures: dict[str, Any] = {"load_before": load_before}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            at = round(time.monotonic() - started, 2)
            progress = _PROGRESS.match(line)
            if progress:
                # "worker serving", "etcd ready on 127.0.0.1:PORT", "chain fed: 3 test
                # tokens, ...": the step, not its details.
                step = re.sub(r"( on |: |, ).*", "", progress[1])
                figures.setdefault(step, at)
            elif line.startswith("BlockX dev cluster is up"):
                figures["banner"] = at
            elif line.startswith(READY_LINE):
                figures["ready"] = at
                break
        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
        figures["stop_s"] = round(time.monotonic() - stopping, 2)
        figures["exit"] = proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)
    figures["load_after"] = _load()
    return figures


def print_table(title: str, runs: list[dict[str, Any]]) -> None:
    print(f"\n{title}: {len(runs)} runs")
    header = f"{'figure':<40}{'median':>10}{'min':>10}{'max':>10}"
    print(header)
    print("-" * len(header))
    keys = list(dict.fromkeys(k for r in runs for k, v in r.items() if isinstance(v, int | float)))
    for key in keys:
        values = [r[key] for r in runs if key in r]
        print(f"{key:<40}{statistics.median(values):>10g}{min(values):>10g}{max(values):>10g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of blockx demo")
    parser.add_argument("--dev-up-runs", type=int, default=3, help="runs of blockx dev up")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each")
    parser.add_argument(
        "--blockx", type=Path, default=Path(sys.executable).parent / "blockx", help="the CLI"
    )
    args = parser.parse_args()
    if args.runs < 0 or args.dev_up_runs < 0:
        parser.error("--runs and --dev-up-runs must be >= 0")
    if args.cold and os.geteuid() != 0:
        parser.error("--cold drops the page cache: run it as root")
    blockx = args.blockx.absolute()
    # The checkout that CLI belongs to (.venv/bin/blockx): its examples/ and anvil.
    checkout = blockx.parents[2] if blockx.parent.parent.name == ".venv" else Path.cwd()
    params = {"blockx": str(blockx), "cold": args.cold, "cores": os.cpu_count()}
    demo: list[dict[str, Any]] = []
    dev_up: list[dict[str, Any]] = []
    for _ in range(args.runs):
        if args.cold:
            _drop_caches()
        demo.append(run_demo(str(blockx), checkout))
    for _ in range(args.dev_up_runs):
        if args.cold:
            _drop_caches()
        dev_up.append(run_dev_up(str(blockx), checkout))
    print("parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()))
    if demo:
        print_table("blockx demo (seconds; tx/s)", demo)
    if dev_up:
        print_table("blockx dev up (seconds from its start)", dev_up)
    print(json.dumps({"bench": "demo", "params": params, "demo": demo, "dev_up": dev_up}))


if __name__ == "__main__":
    main()
