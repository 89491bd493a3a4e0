"""``blockx`` as a real subprocess: the README's demo, dev up, and a submission."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port

from blockx_cli.devcluster import LocalCluster
from blockx_client.dev_config import DEV_VARIABLES

ROOT = Path(__file__).resolve().parents[2]


def blockx_binary() -> str:
    binary = shutil.which("blockx")
    assert binary is not None
    return binary


def test_demo_end_to_end() -> None:
    """`blockx demo`, the README's main command, as a newcomer runs it: every stage
    timed, backfill and live through blockx_drive.backfill and blockx_drive.follow, the
    token table read back from the sink, and the checks against the chain (coverage,
    totals, the reorg) passed."""
    started = time.monotonic()
    result = subprocess.run(
        [blockx_binary(), "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # Every stage timed, in its line and in the figures; the start of the cluster
    # too, and the stop; the times add up to no more than the demo took.
    stages = (
        "start the cluster",
        "generate the chain",
        "ingest",
        "backfill",
        "decoded events",
        "live",
        "results",
    )
    times = [float(t) for t in re.findall(r"│ stage: [a-z ]+ +│ +(\d+\.\d) s │", out)]
    assert len(times) == len(stages), out
    for stage, seconds in zip(stages, times, strict=True):
        assert f"✓ {stage} in {seconds:.1f} s" in out, stage
    assert re.search(r"│ cluster serving, from its start +│ +\d+\.\d s │", out), out
    assert re.search(r"the cluster serves \(\d+\.\d s after its start, waited \d+\.\d s", out)
    assert re.search(r"stopped in \d+\.\d s", out)
    done = float(re.findall(r"done in (\d+\.\d) s", out)[0])
    assert sum(times) <= done + 0.05 * len(times) <= took + 0.05 * len(times)
    assert "1,500 blocks" in out
    # Ingest followed the generation; the runs' summaries add up to every block.
    ingest = re.search(
        r"stage \d: ingest — blocks 0-(\d+) into the block database \(([\d,]+) of them "
        r"ingested while the chain was generated\)",
        out,
    )
    assert ingest is not None, out
    assert f"  {int(ingest[1]) + 1:,} blocks, " in out
    tokens = re.findall(r"│ (TT\d) +│ 0x[0-9a-f]{40} +│ +([\d,]+) │", out)
    assert sorted(symbol for symbol, _ in tokens) == ["TT0", "TT1", "TT2"], out
    assert all(int(count.replace(",", "")) > 0 for _, count in tokens)
    assert re.search(
        r"✓ sink covers blocks 0-\d+: each written once, under its canonical hash", out
    )
    assert "✓ sink totals per token equal the block database's" in out
    assert "✓ reorg corrected: 3 blocks rewritten, sink matches chain" in out
    # The pair's Swaps, decoded by the Worker (unit: event), match their logs.
    assert re.search(r"✓ swap volume of each of [\d,]+ blocks equals the pair's [\d,]+ Swap", out)
    # The stages run the drivers of blockx_drive, and follow reported the reorg it reconciled.
    assert "backfill — blockx_drive.backfill:" in out
    assert re.search(r"blockx_drive\.follow writing each block", out)
    assert re.search(r"reorg of depth 3 above block \d+: follow rewrites \d+ blocks", out), out
    assert re.search(r"head lag \(mined → rows committed\) +│ +p50 \d+ ms", out)
    assert "done in" in out
    assert "Traceback" not in out + result.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    local = LocalCluster(ROOT / "examples", chain=False)
    try:
        yield local.wait_ready()
    finally:
        local.stop()


def test_submit_wait_as_a_subprocess(cluster: dict[str, str]) -> None:
    env = {**os.environ, "BLOCKX_COORDINATOR": cluster["coordinator"]}
    result = subprocess.run(
        [blockx_binary(), "submit", "examples/tasks/hello_world.json", "--wait"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "SUCCEEDED" in result.stdout


def test_bad_flags_are_a_usage_error_without_traceback() -> None:
    result = subprocess.run(
        [blockx_binary(), "submit", "--call", "not json", "--function", "f"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "is not JSON" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    deep = "[" * 50_000 + "]" * 50_000  # an argument holds at most 128 KiB
    result = subprocess.run(
        [blockx_binary(), "submit", "--call", deep, "--function", "f"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    # One line, with the flag's value cut short.
    assert result.stderr.startswith("error: --call '[[[")
    assert "(100000 bytes) is not JSON: nested too deeply to decode" in result.stderr
    assert len(result.stderr) < 1000
    assert "Traceback" not in result.stderr + result.stdout


# A function reading chain data, served next to the examples.
HEAD_FUNCTION = """
from blockx_executor import io


async def ingested_head():
    return await io.blockdb.head()
"""
# What points a shell at a cluster; another shell starts without any of it.
CLUSTER_VARIABLES = (*DEV_VARIABLES, "XDG_CONFIG_HOME")


def _another_shell(config_home: Path) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    return {**kept, "XDG_CONFIG_HOME": str(config_home), "COLUMNS": "200"}


def _blockx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [blockx_binary(), *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def _rpc(url: str, method: str, *params: object) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["result"]


def test_dev_up_runs_until_ctrl_c(tmp_path: Path) -> None:
    """dev up with its chain: the banner, every metrics endpoint, dev.toml naming
    the proxy and the chain, a second dev up refused while this one runs, and a
    function reading the block database through ``blockx invoke`` from another
    shell; Ctrl-C stops it all."""
    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", examples)
    (examples / "functions" / "heads.py").write_text(HEAD_FUNCTION)
    config_home = tmp_path / "config"
    ports = [str(free_port()) for _ in range(7)]
    proc = subprocess.Popen(
        [
            blockx_binary(),
            "dev",
            "up",
            "--examples",
            str(examples),
            "--coordinator-port",
            ports[0],
            "--worker-port",
            ports[1],
            "--sync-invoker-port",
            ports[2],
            "--metrics-port",
            ports[3],
            "--bundle-coordinator-port",
            ports[4],
            "--bundle-worker-port",
            ports[5],
            "--anvil-port",
            ports[6],
            "--blocks",
            "20",
        ],
        cwd=ROOT,
        # Its dev.toml goes to a temporary directory, not the user's ~/.config.
        env=_another_shell(config_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            seen.append(line)
            if "Press Ctrl-C to stop." in line or time.monotonic() > deadline:
                break
        text = "".join(seen)
        assert "BlockX dev cluster is up" in text, text
        # It says what it is doing while it starts, each step timed, before the banner.
        up = text.index("BlockX dev cluster is up")
        for step in (
            "checked the settings of 7 processes",
            "etcd ready on 127.0.0.1:",
            f"anvil ready on http://127.0.0.1:{ports[6]}",
            "started coordinator, worker, bundle coordinator, bundle worker, sync invoker, proxy, "
            "dashboard",
            *(f"{what} serving" for what in ("coordinator", "worker", "bundle worker", "proxy")),
            "dashboard serving",
            "chain fed: 3 test tokens, 20 blocks of history",
        ):
            assert re.search(rf"^ +\d+\.\d s  {re.escape(step)}", text[:up], re.MULTILINE), step
        assert f"bundle coordinator  127.0.0.1:{ports[4]}" in text
        assert f"chain (anvil)       http://127.0.0.1:{ports[6]}" in text
        assert "ingest following the head" in text
        assert "terminal  SUCCEEDED" in text
        # Every process that serves Prometheus says where, and serves there.
        metrics = dict(
            (line.split("(")[-1].rstrip(")\n"), line.split()[1])
            for line in seen
            if line.strip().startswith("metrics ")
        )
        assert sorted(metrics) == [
            "bundle coordinator",
            "bundle worker",
            "coordinator",
            "sync invoker",
            "worker",
        ], text
        assert metrics["coordinator"] == f"http://127.0.0.1:{ports[3]}/metrics"
        for url in metrics.values():
            with urllib.request.urlopen(url, timeout=10) as response:
                assert b"# TYPE " in response.read()

        # dev.toml and the banner's exports name the proxy and the chain too.
        config_file = config_home / "blockx" / "dev.toml"
        written = tomllib.loads(config_file.read_text())
        rpc_url = f"http://127.0.0.1:{ports[6]}"
        assert written["CHAIN_RPC_URL"] == rpc_url
        assert written["BLOCKDB_URL"].startswith("sqlite:///")
        assert written["SINK_DB_URL"].startswith("sqlite:///")
        assert written["BLOCKDB_URL"] != written["SINK_DB_URL"]
        assert Path(written["PROXY_SOCKET_PATH"]).is_socket()
        for name in ("PROXY_SOCKET_PATH", "CHAIN_RPC_URL", "BLOCKDB_URL", "SINK_DB_URL"):
            assert f"    export {name}={written[name]}\n" in text, name

        # A second dev up, in any shell, is refused while this one runs: one line, and
        # nothing started, written or removed.
        before = config_file.read_bytes()
        second = _blockx(_another_shell(config_home), "dev", "up", "--no-chain")
        assert second.returncode == 2, second.stdout + second.stderr
        lock = config_home / "blockx" / "dev.lock"
        assert second.stderr == (
            f"blockx-dev: another blockx dev up is running (pid {proc.pid}), holding {lock}; "
            f"stop it first: Ctrl-C in its terminal, or kill -INT {proc.pid}\n"
        )
        assert second.stdout == ""
        assert config_file.read_bytes() == before

        # Another shell invokes a function reading the block database (through the
        # proxy, as dev.toml names it), once the ingest has stored a block.
        shell = _another_shell(config_home)
        deadline = time.monotonic() + 30
        while True:
            invoked = _blockx(shell, "invoke", "ingested_head", "--json")
            assert invoked.returncode == 0, invoked.stdout + invoked.stderr
            head = json.loads(invoked.stdout)["value"]
            if head is not None:
                break
            assert time.monotonic() < deadline, "the ingest stored no block"
        canonical = _rpc(rpc_url, "eth_getBlockByNumber", hex(head["number"]), False)
        assert head["hash"] == canonical["hash"]
    finally:
        # Ctrl-C, and what it says as it stops (also after a failed assertion above:
        # no cluster is left running).
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "blockx-dev: stopped" in rest
    assert not config_file.exists()
