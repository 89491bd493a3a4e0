"""``blockx chain ingest`` as a real subprocess: the --json summary, follow mode
stopped by SIGTERM, and bad input, a node that answers wrongly and a database that
dies — one clear line, an exit code, nothing written."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from postgres import PostgresServer, find_postgres_bin
from rpc_scripted import (
    Lie,
    ScriptedChain,
    ScriptedRpcServer,
    lying_head,
    served_in_thread,
    shifted_blocks,
)
from support import wait_until
from typer.testing import CliRunner

from blockx_chain.devnet import Anvil, AnvilOptions, Devnet
from blockx_chain.ingest import IngestOptions
from blockx_chain.ingest.errors import IngestError
from blockx_chain.rpc import JsonRpcClient
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {
    "from",
    "to",
    "blocks",
    "transactions",
    "logs",
    "erc20_transfers",
    "nft_transfers",
    "traces",
    "contracts",
    "trace_method",
    "reorgs",
    "seconds",
}


def blockx() -> str:
    binary = shutil.which("blockx")
    assert binary is not None
    return binary


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CHAIN_RPC_URL", "BLOCKDB_URL")}
    return {**env, **extra}


def ingest_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [blockx(), "chain", "ingest", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env or clean_env(),
        check=False,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]


def mine(url: str, blocks: int) -> int:
    """Set up the devnet's tokens and mine ``blocks`` blocks; the head."""

    async def go() -> int:
        async with JsonRpcClient(url) as client:
            net = Devnet(client)
            await net.setup(tokens=2)
            mined = await net.mine(blocks)
            return mined[-1].number

    return asyncio.run(go())


@pytest.fixture(scope="module")
def chain_node() -> Iterator[tuple[Anvil, int]]:
    """One anvil for the module's tests, with a short chain; no test adds to it."""
    with Anvil() as node:
        yield node, mine(node.url, 20)


def test_the_json_summary(chain_node: tuple[Anvil, int], db_url: str) -> None:
    node, head = chain_node
    # --rpc and --db default to CHAIN_RPC_URL and BLOCKDB_URL.
    result = ingest_cli("--json", env=clean_env(CHAIN_RPC_URL=node.url, BLOCKDB_URL=db_url))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary) == SUMMARY_KEYS
    assert (summary["from"], summary["to"], summary["blocks"]) == (0, head, head + 1)
    assert summary["erc20_transfers"] > 0
    assert summary["reorgs"] == 0
    again = json.loads(ingest_cli("--rpc", node.url, "--db", db_url, "--json").stdout)
    assert (again["from"], again["to"], again["blocks"]) == (head + 1, head, 0)


def test_the_command_stores_the_rows_the_library_stores(
    chain_node: tuple[Anvil, int], tmp_path: Path
) -> None:
    """The command runs ingest with its own garbage-collector threshold; the library
    called here runs with the interpreter's: the same rows in every block table."""
    from blockx_chain.ingest import ingest
    from blockx_chain.schema import BLOCK_TABLES

    node, head = chain_node
    by_command, by_library = tmp_path / "command.db", tmp_path / "library.db"
    result = ingest_cli("--rpc", node.url, "--db", f"sqlite:///{by_command}", "--json")
    assert result.returncode == 0, result.stderr
    asyncio.run(ingest(node.url, parse_blockdb_url(f"sqlite:///{by_library}")))

    def rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE blocks SET seen_at_ms = 0")  # when each run stored them
            return {
                t.name: conn.execute(f"SELECT * FROM {t.name} ORDER BY 1, 2, 3").fetchall()
                for t in BLOCK_TABLES
            }

    stored = rows(by_command)
    assert stored == rows(by_library)
    assert len(stored["blocks"]) == head + 1
    assert stored["transactions"]
    assert stored["logs"]
    assert stored["erc20_transfers"]


def test_without_json_it_prints_one_summary_line(
    chain_node: tuple[Anvil, int], tmp_path: Path
) -> None:
    node, head = chain_node
    result = ingest_cli("--rpc", node.url, "--db", f"sqlite:///{tmp_path}/c.db")
    assert result.returncode == 0, result.stderr
    assert f"ingested blocks 0..{head}: {head + 1} blocks" in result.stdout


def test_follow_stops_on_sigterm_after_its_transaction(tmp_path: Path) -> None:
    db = tmp_path / "follow.db"
    with Anvil() as node:
        head = mine(node.url, 3)
        args = ["--rpc", node.url, "--db", f"sqlite:///{db}", "--follow", "--json"]
        proc = subprocess.Popen(
            [blockx(), "chain", "ingest", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=clean_env(),
        )
        try:
            wait_for_head(db, head)
            more = mine(node.url, 2)  # two more setup blocks, then two
            wait_for_head(db, more)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["from"], summary["to"], summary["blocks"]) == (0, more, more + 1)


def stored_head(db: Path) -> int | None:
    if not db.exists():
        return None
    with sqlite3.connect(db) as conn:
        try:
            row = conn.execute("SELECT head_number FROM chain").fetchone()
        except sqlite3.OperationalError:
            return None
    return None if row is None else row[0]


def wait_for_head(db: Path, number: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while stored_head(db) != number:
        assert time.monotonic() < deadline, f"the database never reached block {number}"
        time.sleep(0.05)


# -- bad input ----------------------------------------------------------------------


RPC = "http://127.0.0.1:8545"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--rpc", "localhost:8545"], "--rpc must be an http:// or https:// URL"),
        (["--rpc", "ftp://127.0.0.1:8545"], "--rpc must be an http:// or https:// URL"),
        (["--rpc", "http://127.0.0.1:99999"], "--rpc must be an http:// or https:// URL"),
        (["--rpc", RPC, "--db", "sqlite://rel.db"], "--db must be sqlite:////abs/path.db"),
        (["--rpc", RPC, "--db", "mysql://host/db"], "unknown scheme"),
        (["--rpc", RPC, "--to", "soon"], "--to must be a block number or latest"),
        (["--rpc", RPC, "--follow", "--ws", "http://x:1"], "--ws must be a ws:// or wss://"),
    ],
)
def test_malformed_input_is_one_line_and_exit_2(
    args: list[str], words: str, tmp_path: Path
) -> None:
    db = [] if "--db" in args else ["--db", f"sqlite:///{tmp_path}/x.db"]
    assert_one_line(ingest_cli(*args, *db), 2, words)
    assert list(tmp_path.iterdir()) == []


def test_a_poll_interval_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    result = ingest_cli("--rpc", RPC, "--db", f"sqlite:///{tmp_path}/x.db", "--poll-interval", "0")
    assert result.returncode == 2
    assert "--poll-interval" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", ["0", "1001"])
def test_a_batch_size_out_of_range_is_a_usage_error(size: str, tmp_path: Path) -> None:
    result = ingest_cli("--rpc", RPC, "--db", f"sqlite:///{tmp_path}/x.db", "--batch-size", size)
    assert result.returncode == 2
    assert "--batch-size" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_ingest_options_refuse_a_batch_larger_than_the_bound() -> None:
    with pytest.raises(IngestError, match="the batch size must be 1000 or less, got 1001"):
        IngestOptions(batch_size=1001).check()
    IngestOptions(batch_size=1000).check()


def test_a_bad_chain_ws_url_refuses_start_up_naming_it(tmp_path: Path) -> None:
    result = ingest_cli(
        *("--rpc", RPC, "--db", f"sqlite:///{tmp_path}/x.db", "--follow"),
        env=clean_env(CHAIN_WS_URL="node:8546"),
    )
    assert_one_line(result, 2, "CHAIN_WS_URL must be a ws:// or wss:// URL, or none")
    assert list(tmp_path.iterdir()) == []


def test_no_node_and_no_database_are_usage_errors() -> None:
    assert_one_line(ingest_cli("--db", "sqlite:////tmp/x.db"), 2, "CHAIN_RPC_URL")
    assert_one_line(ingest_cli("--rpc", "http://127.0.0.1:1"), 2, "BLOCKDB_URL")


def test_an_unreachable_node_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    result = ingest_cli("--rpc", "http://127.0.0.1:1", "--db", f"sqlite:///{db}")
    assert_one_line(result, 3, "cannot reach the node at http://127.0.0.1:1")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_database(chain_node: tuple[Anvil, int]) -> None:
    node, _ = chain_node
    result = ingest_cli("--rpc", node.url, "--db", "postgresql://postgres@127.0.0.1:1/blocks")
    assert_one_line(result, 3, "unreachable")


def test_a_database_of_another_chain_is_refused(chain_node: tuple[Anvil, int], db_url: str) -> None:
    node, head = chain_node
    with Anvil(AnvilOptions(chain_id=999)) as other:
        mine(other.url, 2)
        assert ingest_cli("--rpc", other.url, "--db", db_url).returncode == 0
    before = head_of(db_url)
    result = ingest_cli("--rpc", node.url, "--db", db_url, "--json")
    assert_one_line(result, 1, "holds chain 999")
    assert head_of(db_url) == before
    assert before is not None
    assert before["number"] != head


def head_of(db_url: str) -> dict[str, object] | None:
    async def read() -> dict[str, object] | None:
        store = await open_store(parse_blockdb_url(db_url))
        try:
            return await store.head()
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_database_of_another_schema_is_refused(
    chain_node: tuple[Anvil, int], tmp_path: Path
) -> None:
    node, _ = chain_node
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE blocks (x INTEGER)")
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    for path, words in ((foreign, "no BlockX block database"), (newer, "schema version 99")):
        before = path.read_bytes()
        assert_one_line(ingest_cli("--rpc", node.url, "--db", f"sqlite:///{path}"), 1, words)
        assert path.read_bytes() == before


def test_a_second_ingest_says_so(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    with Anvil() as node:
        head = mine(node.url, 2)
        first = subprocess.Popen(
            [blockx(), "chain", "ingest", "--rpc", node.url, "--db", f"sqlite:///{db}", "--follow"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=clean_env(),
        )
        try:
            wait_for_head(db, head)
            second = ingest_cli("--rpc", node.url, "--db", f"sqlite:///{db}")
            assert_one_line(second, 1, "being written by another ingest")
        finally:
            first.send_signal(signal.SIGTERM)
            assert first.wait(20) == 0


def test_chain_devnet_runs_the_devnet_cli() -> None:
    result = subprocess.run(
        [blockx(), "chain", "devnet", "--blocks", "2", "--tokens", "1", "--exit"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["head"] == 4  # the token's deployment, its hand-out, two blocks
    assert len(summary["tokens"]) == 1


# -- a node that answers wrongly ---------------------------------------------------


def _block(tag: str, change: Callable[[Any], Any]) -> Lie:
    def lie(request: dict[str, Any], result: Any) -> Any:
        if request["method"] == "eth_getBlockByNumber" and request["params"][0] == tag:
            return change(result)
        return result

    return lie


def _without_number(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "number"}


@dataclass(frozen=True)
class WrongNode:
    name: str
    lie: Callable[[ScriptedChain], Lie]
    args: tuple[str, ...]
    words: str


WRONG_NODES = [
    WrongNode(
        "another block",
        lambda chain: shifted_blocks(chain, 11, 20),
        ("--from", "11", "--to", "20", "--batch-size", "10"),
        "error: blocks 11..20: eth_getBlockByNumber(0xb, true): the node answered block 111, "
        "not block 11",
    ),
    WrongNode(
        "a head that is not hex",
        lambda _: lying_head("0xzz"),
        (),
        "error: the node's head: eth_blockNumber: not a quantity (0x and 1 to 64 hex digits): "
        "'0xzz'",
    ),
    WrongNode(
        "a head of 4,000 hex digits",
        lambda _: lying_head("0x" + "f" * 4000),
        (),
        "(4002 characters)",
    ),
    WrongNode(
        "a finalized block without number",
        lambda _: _block("finalized", _without_number),
        (),
        "error: the node's head: eth_getBlockByNumber(finalized, false): number is missing",
    ),
    WrongNode(
        "a string for the finalized block",
        lambda _: _block("finalized", lambda _: "a block"),
        (),
        "eth_getBlockByNumber(finalized, false): not an object: 'a block'",
    ),
    WrongNode(
        "a string for the genesis block",
        lambda _: _block("0x0", lambda _: "a block"),
        (),
        "error: eth_getBlockByNumber(0x0, false): not an object: 'a block'",
    ),
]


@pytest.mark.parametrize("node", WRONG_NODES, ids=[n.name for n in WRONG_NODES])
def test_a_node_that_answers_wrongly_is_one_line_and_exit_1_with_nothing_written(
    node: WrongNode, tmp_path: Path
) -> None:
    """In-process, to keep it cheap: the next test runs the command as a real process."""
    chain = ScriptedChain(head=200)
    chain.lie = node.lie(chain)
    db = tmp_path / "chain.db"
    with served_in_thread(chain) as url:
        result = CliRunner().invoke(
            app, ["chain", "ingest", "--rpc", url, "--db", f"sqlite:///{db}", *node.args]
        )
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    assert_one_line(
        subprocess.CompletedProcess([], result.exit_code, result.stdout, result.stderr),
        1,
        node.words,
    )
    # Nothing is left, not even the database file.
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_answer_leaves_a_database_that_was_there_as_it_was(tmp_path: Path) -> None:
    chain = ScriptedChain(head=200)
    db = tmp_path / "chain.db"
    ingest = ["chain", "ingest", "--db", f"sqlite:///{db}", "--batch-size", "10"]
    with served_in_thread(chain) as url:
        first = CliRunner().invoke(app, [*ingest, "--rpc", url, "--to", "10"])
        assert first.exit_code == 0, first.output
        chain.lie = shifted_blocks(chain, 11, 20)
        second = CliRunner().invoke(app, [*ingest, "--rpc", url, "--to", "20"])
    assert second.exit_code == 1, second.output
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT max(block_number), count(*) FROM blocks").fetchone() == (10, 11)


async def test_postgresql_dying_mid_ingest_is_one_line(tmp_path: Path) -> None:
    """A server of this test's own, stopped while a following ingest writes batch after
    batch: the error is one line, and nothing asyncpg logs reaches stderr."""
    bin_dir = find_postgres_bin()
    assert bin_dir is not None
    server = PostgresServer(bin_dir)
    await asyncio.to_thread(server.start)
    try:
        conn = await asyncpg.connect(server.url())
        try:
            await conn.execute("CREATE DATABASE blocks")
        finally:
            await conn.close()
        chain = ScriptedChain(head=2000)
        async with ScriptedRpcServer(chain) as node:
            args = ["--rpc", node.url, "--db", server.url("blocks"), "--follow"]
            proc = await asyncio.create_subprocess_exec(
                blockx(),
                *("chain", "ingest", *args, "--batch-size", "1", "--poll-interval", "0.05"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=ROOT,
                env=clean_env(),
            )
            try:
                await wait_until(
                    lambda: _postgres_head_at_least(server.url("blocks"), 20), "20 blocks written"
                )
                await asyncio.to_thread(server.stop_server)
                chain.head += 10  # more to write, should the ingest have caught up
                out, err = await asyncio.wait_for(proc.communicate(), 60)  # a hang guard
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    finally:
        await asyncio.to_thread(server.stop)
    assert proc.returncode is not None
    result = subprocess.CompletedProcess([], proc.returncode, out.decode(), err.decode())
    assert_one_line(result, 3, "is unreachable")
    assert "Traceback" not in result.stderr


async def _postgres_head_at_least(url: str, number: int) -> bool:
    conn = await asyncpg.connect(url)
    try:
        head = await conn.fetchval("SELECT head_number FROM chain")
    except asyncpg.UndefinedTableError:
        return False
    finally:
        await conn.close()
    return head is not None and head >= number


def test_traces_are_ingested_with_the_method_named(
    chain_node: tuple[Anvil, int], tmp_path: Path
) -> None:
    node, head = chain_node
    db = f"sqlite:///{tmp_path}/c.db"
    result = ingest_cli("--rpc", node.url, "--db", db, "--traces", "--to", str(head - 1))
    assert result.returncode == 0, result.stderr
    assert "call frames (by debug_traceBlockByNumber)" in result.stdout
    # The devnet's two tokens, its ERC-721 and its ERC-1155.
    assert "4 contracts created" in result.stdout
    # The database holds traces: the next run traces without being told.
    again = json.loads(ingest_cli("--rpc", node.url, "--db", db, "--json").stdout)
    assert again["trace_method"] == "debug_traceBlockByNumber"
    assert (again["blocks"], again["traces"]) == (1, 12)
