"""Two chains in one cluster: two anvils started with different chain ids, each
ingested into its own SQLite block database, served by one real ``blockx-worker``
from ``[chains.NAME]`` tables of its ``--config`` file. Tasks on each chain, a
cross-chain read through ``io.router``, ``io.meta`` on each, an unknown chain; the
refusals at start-up, one line each and exit 2. A Sync Invoker over the same two
chains: an invoke reads the chain it names, and one it does not serve is refused
naming those it does. A backfill of base's pair's Swap
events through a bundle cluster (``--unit event``): one row per event, holding what
the node says the pair emitted."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chain_cluster import ChainCluster
from grpclib.client import Channel
from grpclib.const import Status
from processes import (
    EXAMPLES,
    CoordinatorProcess,
    SyncInvokerProcess,
    WorkerProcess,
    execute_result,
    run_to_end,
)
from support import wait_until
from typer.testing import CliRunner

from blockx_chain.abi.spec import entries_json, entry_from_signature
from blockx_chain.contracts import SWAP_TOPIC
from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.devnet.anvil import AnvilOptions
from blockx_chain.ingest import IngestOptions, ingest
from blockx_chain.rpc import JsonRpcClient, quantity
from blockx_chain.sink import open_sink
from blockx_chain.store import open_store
from blockx_chain.url import parse_blockdb_url
from blockx_cli.app import app
from blockx_client import ChainNotServedError, Client, InvalidRequestError
from blockx_core.registry import RegistryKind, v2_registry_prefix
from blockx_drive import (
    BackfillDone,
    BlockWritten,
    JobSpec,
    TaskFinished,
    TaskOutcome,
    backfill,
    follow,
)
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

ETH_ID = 31337
BASE_ID = 8453
PREFIX = v2_registry_prefix("test", f"t-{secrets.token_hex(5)}", RegistryKind.BLOCK)

FUNCTIONS = """
from blockx_executor import IoError, io

async def here():
    head = await io.blockdb.head()
    return {
        "head": head["number"],
        "node": await io.rpc.chain_id(),
        "meta": await io.meta.chain(),
        "code_epoch": await io.meta.code_epoch(),
    }

async def own_block(number):
    return await io.blockdb.block(number)

async def across(name, number):
    return await io.router.chain(name).blockdb.block(number)

async def meta_of(name):
    return await io.meta.chain(name)

def per_block(arg):
    return {"transactions": len(arg["rows"]), "seen": arg["block"]["block_hash"]}

async def refused(name):
    try:
        await io.router.chain(name).blockdb.head()
    except IoError as exc:
        return {"kind": exc.kind, "retryable": exc.retryable, "message": exc.message}
    return None
"""


@dataclass(frozen=True)
class ChainUnderTest:
    name: str
    chain_id: int
    node: str
    db_url: str
    head: int
    token: str
    # The token/ETH pair, on the chain that trades on one.
    pair: str | None


async def _devnet_and_ingest(
    node: Anvil, db_url: str, blocks: int, *, swaps: int
) -> tuple[int, str, str | None]:
    async with JsonRpcClient(node.url) as client:
        devnet = Devnet(client)
        await devnet.setup(tokens=1)
        if swaps:
            await devnet.setup_pair()
        await devnet.mine(blocks, swaps=swaps)
        head = int(await client.request("eth_blockNumber", []), 16)
    await ingest(node.url, parse_blockdb_url(db_url), IngestOptions(confirmations=0))
    return head, devnet.tokens[0].address, devnet.pair


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ChainUnderTest]]:
    """Two devnets of different chain ids and lengths, each ingested into its database."""
    root = tmp_path_factory.mktemp("chains")
    with (
        Anvil(AnvilOptions(chain_id=ETH_ID)) as eth,
        Anvil(AnvilOptions(chain_id=BASE_ID)) as base,
    ):
        made: dict[str, ChainUnderTest] = {}
        for name, node, chain_id, blocks, swaps in (
            ("eth", eth, ETH_ID, 1, 0),
            ("base", base, BASE_ID, 3, 3),
        ):
            url = f"sqlite:///{root}/{name}.db"
            head, token, pair = asyncio.run(_devnet_and_ingest(node, url, blocks, swaps=swaps))
            made[name] = ChainUnderTest(name, chain_id, node.url, url, head, token, pair)
        yield made


def chains_toml(chains: dict[str, ChainUnderTest]) -> str:
    return "".join(
        f'[chains.{c.name}]\nchain_id = {c.chain_id}\nblockdb_url = "{c.db_url}"\n'
        f'rpc_url = "{c.node}"\n\n'
        for c in chains.values()
    )


@pytest.fixture(scope="module")
def sink_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('sink')}/sink.db"


@pytest.fixture(scope="module")
def worker(
    chains: dict[str, ChainUnderTest],
    sink_url: str,
    etcd_server: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    root = tmp_path_factory.mktemp("worker")
    (root / "functions").mkdir()
    (root / "functions" / "chainfns.py").write_text(FUNCTIONS)
    config = root / "worker.toml"
    config.write_text(chains_toml(chains))
    process = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": PREFIX,
            "WORKER_HEARTBEAT_INTERVAL": "100",
            "FUNCTIONS_DIR": str(root / "functions"),
            "SINK_DB_URL": sink_url,
        },
        root / "worker.log",
        args=["--config", str(config)],
    )
    yield process
    assert process.stop() == 0
    assert "Traceback" not in process.output()


@pytest.fixture(scope="module")
def coordinator(
    worker: WorkerProcess, etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """A Coordinator over the one Worker, for the drivers."""
    process = CoordinatorProcess(
        {"ETCD_ENDPOINTS": etcd_server.endpoint, "COORDINATOR_REGISTRY_PREFIXES": PREFIX},
        tmp_path_factory.mktemp("coordinator") / "coordinator.log",
    )

    def sees_worker() -> bool:
        process.assert_alive()
        try:
            return 'blockx_coordinator_registry_workers{format="v2"} 1.0' in process.metrics()
        except OSError:
            return False

    asyncio.run(worker.wait_ready())
    asyncio.run(wait_until(sees_worker, "the coordinator's view of the worker", timeout=30))
    yield process
    process.stop()


def task(task_id: str, function: str, calls: list[list[Any]], chain: str | None) -> Any:
    config: dict[str, Any] = {"function": function, "callList": calls}
    if chain is not None:
        config["chain"] = chain
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="CallListCallConfig", config=json.dumps(config)
        ),
        result_handler=worker_v1.ResultHandler(type="ReturnValueResultHandler", config="{}"),
    )


async def run(worker: WorkerProcess, the_task: Any) -> worker_v1.TaskUpdate:
    await worker.wait_ready()
    channel = Channel(worker.host, worker.port)
    try:
        return await run_to_end(worker_v1.WorkerServiceStub(channel), the_task, timeout=30)
    finally:
        channel.close()


async def outputs(worker: WorkerProcess, the_task: Any) -> list[Any]:
    final = await run(worker, the_task)
    assert final.state is worker_v1.TaskState.SUCCEEDED, final
    values: list[Any] = json.loads(execute_result(final).plugin_results[0].result)
    return values


async def test_each_task_reads_its_own_chain_and_another_through_the_router(
    worker: WorkerProcess, chains: dict[str, ChainUnderTest]
) -> None:
    eth, base = chains["eth"], chains["base"]
    for chain in (eth, base):
        (seen,) = await outputs(worker, task(f"t-here-{chain.name}", "here", [[]], chain.name))
        assert seen["head"] == chain.head
        assert seen["node"] == chain.chain_id
        meta = seen["meta"]
        assert (meta["name"], meta["chain_id"]) == (chain.name, chain.chain_id)
        assert meta["head"]["number"] == chain.head
        assert meta["ingested"] == {"from_block": 0, "to_block": chain.head}
        assert meta["log_filter"] is None
        assert isinstance(seen["code_epoch"], int)
    # An eth task reads base's block through the router (eth has no such block).
    assert eth.head < base.head
    (direct,) = await outputs(worker, task("t-own-base", "own_block", [[base.head]], "base"))
    (own,) = await outputs(worker, task("t-own-eth", "own_block", [[base.head]], "eth"))
    (across,) = await outputs(worker, task("t-across", "across", [["base", base.head]], "eth"))
    assert own is None
    assert direct["block_number"] == base.head
    assert across == direct
    (meta,) = await outputs(worker, task("t-meta-of", "meta_of", [["base"]], "eth"))
    assert meta["chain_id"] == BASE_ID


async def test_an_unknown_chain_is_refused_naming_the_chains_served(
    worker: WorkerProcess,
) -> None:
    (refused,) = await outputs(worker, task("t-refused", "refused", [["polygon"]], "eth"))
    assert refused == {
        "kind": "UNKNOWN_CHAIN",
        "retryable": False,
        "message": "no chain 'polygon': this process serves base, eth",
    }
    # A task naming a chain the Worker does not serve fails fast, not retryable.
    final = await run(worker, task("t-elsewhere", "here", [[]], "polygon"))
    assert final.state is worker_v1.TaskState.FAILED
    result = execute_result(final)
    assert result.failure_code == "ACTIVATION_FAILED"
    assert not result.retryable
    assert "does not serve chain 'polygon' (it serves: base, eth)" in result.failure_message
    # With two chains served, a task must name one.
    final = await run(worker, task("t-unnamed", "here", [[]], None))
    assert final.state is worker_v1.TaskState.FAILED
    assert 'must name one ("chain": NAME)' in execute_result(final).failure_message
    # ListTasks (what `blockx tasks` and the dashboard show) names each task's chain.
    channel = Channel(worker.host, worker.port)
    try:
        listed = await worker_v1.WorkerServiceStub(channel).list_tasks(worker_v1.ListTasksRequest())
    finally:
        channel.close()
    chain_of = {t.task_id: t.chain for t in listed.tasks}
    assert (chain_of["t-refused"], chain_of["t-elsewhere"], chain_of["t-unnamed"]) == (
        "eth",
        "polygon",
        "",
    )


@pytest.fixture
def start_refused(etcd_server: EtcdServer) -> Any:
    def start(env: dict[str, str], *args: str) -> list[str]:
        base = {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
        }
        return refused_start({**base, **env}, *args)

    return start


def refused_start(env: dict[str, str], *args: str) -> list[str]:
    """The lines a Worker that must not start prints to say why (its log lines
    aside); it exits 2."""
    binary = shutil.which("blockx-worker")
    assert binary is not None
    done = subprocess.run(
        [binary, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("blockx-worker: ")]


def test_bad_chain_tables_are_refused_one_line_each(
    chains: dict[str, ChainUnderTest], tmp_path: Path, start_refused: Any
) -> None:
    eth = chains["eth"]
    config = tmp_path / "bad.toml"
    config.write_text(
        chains_toml(chains)
        + f'[chains.copy]\nchain_id = {BASE_ID}\nrpc_url = "{eth.node}"\n\n'
        + '[chains.broken]\nchain_id = 5\nblockdb_url = "mysql://x"\nrpc_url = "ftp://x"\n'
        + "colour = 1\n\n"
        + "[chains.empty]\nchain_id = 6\n"
    )
    lines = start_refused({"BLOCKDB_URL": eth.db_url}, "--config", str(config))
    path = str(config)
    expected = [
        "BLOCKDB_URL is the one-chain shorthand and cannot be set with [chains.NAME] tables",
        "chains.broken.colour is no key of a chain (keys: chain_id, blockdb_url, rpc_url, "
        f"blockdb_executor_url) (in {path})",
        "chains.broken.blockdb_url ",
        "chains.broken.rpc_url must be an http:// or https:// URL of a JSON-RPC node "
        f"(got 'ftp://x') (in {path})",
        f"chains.copy.chain_id is {BASE_ID}, as [chains.base]'s: two chains cannot share a "
        f"chain id (in {path})",
        "chains.empty names neither blockdb_url nor rpc_url",
    ]
    for text in expected:
        assert sum(text in line for line in lines) == 1, (text, lines)
    assert len(lines) == len(expected), lines
    assert all(line.startswith("blockx-worker: invalid configuration: ") for line in lines)


def test_a_database_or_node_of_another_chain_is_refused_at_start_up(
    chains: dict[str, ChainUnderTest], tmp_path: Path, start_refused: Any
) -> None:
    eth, base = chains["eth"], chains["base"]
    config = tmp_path / "swapped.toml"
    config.write_text(f'[chains.eth]\nchain_id = {ETH_ID}\nblockdb_url = "{base.db_url}"\n')
    assert start_refused({}, "--config", str(config)) == [
        f"blockx-worker: cannot start: [chains.eth] blockdb_url: the block database holds "
        f"chain id {BASE_ID}, not the table's chain_id {ETH_ID}"
    ]
    # The shorthand: the node must serve the chain its database holds.
    assert start_refused({"BLOCKDB_URL": eth.db_url, "CHAIN_RPC_URL": base.node}) == [
        f"blockx-worker: cannot start: CHAIN_RPC_URL: the node serves chain id {BASE_ID}, "
        f"not the block database's {ETH_ID}"
    ]


def test_chain_ingest_reads_a_chain_table_of_the_config_file(
    chains: dict[str, ChainUnderTest], tmp_path: Path
) -> None:
    eth = chains["eth"]
    db = f"sqlite:///{tmp_path}/again.db"
    config = tmp_path / "ingest.toml"
    config.write_text(
        'ETCD_ENDPOINTS = "127.0.0.1:2379"\n\n'
        f'[chains.eth]\nchain_id = {ETH_ID}\nblockdb_url = "{db}"\nrpc_url = "{eth.node}"\n\n'
        f'[chains.wrong]\nchain_id = 1\nblockdb_url = "{db}"\nrpc_url = "{eth.node}"\n'
    )
    blockx = shutil.which("blockx")
    assert blockx is not None

    def ingest_chain(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [blockx, "chain", "ingest", "--chain", name, "--config", str(config), "--json"],
            env={k: v for k, v in os.environ.items() if k not in ("BLOCKDB_URL", "CHAIN_RPC_URL")},
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = ingest_chain("eth")
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["to"] == eth.head
    wrong = ingest_chain("wrong")
    assert wrong.returncode == 1, wrong
    assert wrong.stderr.strip().endswith(
        f"the node at {eth.node} serves chain id {ETH_ID}, not the table's chain_id 1"
    )


async def _per_block(chain: ChainUnderTest) -> list[tuple[int, str, int]]:
    """What one chain's follow must write: each block with its transaction count."""
    store = await open_store(parse_blockdb_url(chain.db_url))
    try:
        return [
            (b["block_number"], b["block_hash"], len(await store.transactions(b["block_number"])))
            for b in await store.blocks(0, chain.head)
        ]
    finally:
        await store.close()


async def test_two_chains_follows_write_one_sink_table_without_touching_each_others_rows(
    chains: dict[str, ChainUnderTest], coordinator: CoordinatorProcess, sink_url: str
) -> None:
    """A follow of each chain, at once, into one table of one sink: the block numbers
    overlap, and each chain's rows and ledger are exactly its own blocks'."""
    stop = asyncio.Event()

    async def follow_chain(chain: ChainUnderTest) -> list[int]:
        written: list[int] = []
        async with Client(coordinator=f"127.0.0.1:{coordinator.port}") as client:
            async for event in follow(
                client,
                JobSpec(
                    function="per_block",
                    source_table="transactions",
                    unit="block",
                    sink_table="per_block",
                    db_url=chain.db_url,
                    sink_db_url=sink_url,
                    chain=chain.name,
                ),
                from_block=0,
                stop=stop,
            ):
                if isinstance(event, BlockWritten):
                    written.append(event.number)
        return written

    running = [asyncio.create_task(follow_chain(c)) for c in chains.values()]
    heads = {c.chain_id: c.head for c in chains.values()}

    async def both_written() -> bool:
        for task_ in running:
            if task_.done():
                task_.result()
                raise AssertionError("a follow ended by itself")
        sink = await open_sink(parse_blockdb_url(sink_url))
        try:
            counts = {i: len(await sink.written("per_block", i)) for i in heads}
        finally:
            await sink.close()
        return all(counts[i] == head + 1 for i, head in heads.items())

    await wait_until(both_written, "both chains' blocks in the sink", timeout=60)
    stop.set()
    written = await asyncio.gather(*running)
    for chain, numbers in zip(chains.values(), written, strict=True):
        assert sorted(numbers) == list(range(chain.head + 1))
    sink = await open_sink(parse_blockdb_url(sink_url))
    try:
        rows = await sink.rows("per_block")
        ledgers = {c.chain_id: await sink.written("per_block", c.chain_id) for c in chains.values()}
    finally:
        await sink.close()
    for chain in chains.values():
        expected = await _per_block(chain)
        mine = sorted(
            (r["block_number"], r["block_hash"], r["transactions"])
            for r in rows
            if r["chain_id"] == chain.chain_id
        )
        assert mine == expected
        assert [(w["block_number"], w["block_hash"]) for w in ledgers[chain.chain_id]] == [
            (n, h) for n, h, _ in expected
        ]
    assert all(r["seen"] == r["block_hash"] for r in rows)
    assert {r["chain_id"] for r in rows} == {ETH_ID, BASE_ID}
    # The same block numbers, once per chain.
    assert len(rows) == sum(c.head + 1 for c in chains.values())


SWAP_FUNCTIONS = """
def swap(arg):
    args = arg["event"]["args"]
    return {
        "log_index": arg["log"]["log_index"],
        "name": arg["event"]["name"],
        "sender": args["sender"],
        "to": args["to"],
        "amounts": " ".join(
            str(args[k]) for k in ("amount0In", "amount1In", "amount0Out", "amount1Out")
        ),
    }
"""
PAIR_ABI = [
    "event Swap(address indexed sender, uint256 amount0In, uint256 amount1In, "
    "uint256 amount0Out, uint256 amount1Out, address indexed to)",
    "event Sync(uint112 reserve0, uint112 reserve1)",
]


@pytest.fixture(scope="module")
def bundle(
    chains: dict[str, ChainUnderTest],
    etcd_server: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ChainCluster, str]]:
    """A bundle cluster over base's block database, the pair's ABI registered in it,
    and a sink of its own."""
    base = chains["base"]
    pair = base.pair
    assert pair is not None

    async def register() -> None:
        store = await open_store(parse_blockdb_url(base.db_url))
        try:
            document = entries_json([entry_from_signature(line) for line in PAIR_ABI])
            async with store.writer() as w:
                await w.put_abi("pair", document, [pair])
        finally:
            await store.close()

    asyncio.run(register())
    root = tmp_path_factory.mktemp("bundle")
    (root / "functions").mkdir()
    (root / "functions" / "swaps.py").write_text(SWAP_FUNCTIONS)
    sink = f"sqlite:///{root}/sink.db"
    cluster = ChainCluster(
        etcd_server,
        root,
        RegistryKind.BUNDLE,
        chain_url=base.db_url,
        sink_url=sink,
        functions=root / "functions",
    )
    with cluster.serving():
        yield cluster, sink


async def _emitted_swaps(chain: ChainUnderTest) -> list[tuple[Any, ...]]:
    """The pair's Swap logs as the node gives them, decoded by hand: sender and to
    are topics 1 and 2, the amounts the four words of data."""
    async with JsonRpcClient(chain.node) as client:
        logs = await client.request(
            "eth_getLogs",
            [
                {
                    "fromBlock": quantity(0),
                    "toBlock": quantity(chain.head),
                    "address": chain.pair,
                    "topics": [SWAP_TOPIC],
                }
            ],
        )
    digits = [log["data"][2:] for log in logs]
    return [
        (
            int(log["blockNumber"], 16),
            log["blockHash"],
            int(log["logIndex"], 16),
            "0x" + log["topics"][1][-40:],
            "0x" + log["topics"][2][-40:],
            " ".join(str(int(data[i : i + 64], 16)) for i in range(0, 256, 64)),
        )
        for log, data in zip(logs, digits, strict=True)
    ]


async def _backfill(cluster: ChainCluster, *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    blockx = shutil.which("blockx")
    assert blockx is not None
    proc = await asyncio.create_subprocess_exec(
        blockx,
        *cluster.cli_args(),
        "backfill",
        "--function",
        "swap",
        "--source-table",
        "logs",
        "--from",
        "0",
        "--blocks-per-task",
        "4",
        "--json",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, [json.loads(line) for line in out.decode().splitlines()], err.decode()


async def test_a_backfill_of_the_event_unit_writes_one_row_per_event_the_pair_emitted(
    chains: dict[str, ChainUnderTest], bundle: tuple[ChainCluster, str]
) -> None:
    cluster, sink_db = bundle
    base = chains["base"]
    emitted = await _emitted_swaps(base)
    assert len(emitted) >= 3
    databases = ["--to", str(base.head), "--db", base.db_url, "--sink-db", sink_db]
    event_unit = ["--unit", "event", "--abi", "pair"]
    code, events, err = await _backfill(
        cluster, *event_unit, "--event", "Swap", "--sink-table", "swaps", *databases
    )
    assert code == 0, err
    assert events[-1]["rows"] == len(emitted)
    sink = await open_sink(parse_blockdb_url(sink_db))
    try:
        rows = await sink.rows("swaps")
    finally:
        await sink.close()
    assert {r["name"] for r in rows} == {"Swap"}
    written = sorted(
        (r["block_number"], r["block_hash"], r["log_index"], r["sender"], r["to"], r["amounts"])
        for r in rows
    )
    assert written == sorted(emitted)

    # An event the ABI lacks fails each task at once, not retryable: reported, not
    # attempted again, naming the ABI's events.
    finished: list[TaskFinished] = []
    async with Client(bundle_coordinator=cluster.coordinator_addr) as client:
        async for happened in backfill(
            client,
            JobSpec(
                function="swap",
                source_table="logs",
                unit="event",
                abi="pair",
                event="Mint",
                sink_table="mints",
                db_url=base.db_url,
                sink_db_url=sink_db,
            ),
            from_block=0,
            to_block=base.head,
            blocks_per_task=base.head + 1,
        ):
            if isinstance(happened, TaskFinished):
                finished.append(happened)
            elif isinstance(happened, BackfillDone):
                assert (happened.failed, happened.retries, happened.rows) == (1, 0, 0)
    (failed,) = finished
    assert (failed.outcome, failed.attempt) == (TaskOutcome.FAILED, 1)
    assert failed.failure_code == "BUILDER_FAILED"
    assert "'Mint'" in failed.failure_message, failed.failure_message
    assert "Swap" in failed.failure_message, failed.failure_message


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--unit", "event", "--abi", "pair"], "--unit event needs --abi NAME and --event NAME"),
        (["--unit", "event", "--event", "Swap"], "--unit event needs --abi NAME and --event NAME"),
        (["--abi", "pair", "--event", "Swap"], "--abi and --event go with --unit event"),
        (["--unit", "block", "--event", "Swap"], "--abi and --event go with --unit event"),
    ],
)
def test_the_event_units_flags_are_refused_in_one_line(argv: list[str], expected: str) -> None:
    for command in ("backfill", "follow"):
        range_ = ["--from", "0", "--to", "1"] if command == "backfill" else []
        result = CliRunner().invoke(
            app,
            [
                command,
                "--function",
                "f",
                "--source-table",
                "logs",
                "--sink-table",
                "t",
                *range_,
                *argv,
            ],
        )
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert lines == [f"error: {expected}"], lines


async def test_an_invoke_reads_the_chain_it_names(
    chains: dict[str, ChainUnderTest], tmp_path: Path
) -> None:
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "chainfns.py").write_text(FUNCTIONS)
    config = tmp_path / "invoker.toml"
    config.write_text(chains_toml(chains))
    invoker = SyncInvokerProcess(
        {"FUNCTIONS_DIR": str(tmp_path / "functions"), "EXECUTOR_COUNT": "1"},
        tmp_path / "syncinvoker.log",
        args=["--config", str(config)],
    )
    try:
        await invoker.wait_ready()
        async with Client(sync_invoker=invoker.addr) as client:
            here = client.function("here")
            for chain in chains.values():
                seen = await here.call(chain=chain.name)
                assert (seen["head"], seen["node"]) == (chain.head, chain.chain_id)
                assert (seen["meta"]["name"], seen["meta"]["chain_id"]) == (
                    chain.name,
                    chain.chain_id,
                )
            debugged = await here.debug(chain="eth")
            assert debugged.success, debugged
            assert debugged.value["node"] == ETH_ID
            # Another chain through the router, from an invoke of eth.
            base = chains["base"]
            across = await client.function("across").call("base", base.head, chain="eth")
            assert across["block_number"] == base.head
            # A chain it does not serve, and none named where it serves two.
            with pytest.raises(ChainNotServedError) as unknown:
                await here.invoke(chain="polygon")
            assert unknown.value.status is Status.FAILED_PRECONDITION
            assert unknown.value.message == (
                "FAILED_PRECONDITION: this Sync Invoker does not serve chain 'polygon' "
                "(it serves: base, eth)"
            )
            with pytest.raises(ChainNotServedError, match=r"serves several chains \(base, eth\)"):
                await here.debug()
            # A name no chain can have is a bad request, and the answer does not echo it
            # (a status message travels in a header, which the peer bounds).
            with pytest.raises(InvalidRequestError) as bad:
                await here.debug(chain="x" * 70_000)
            assert bad.value.status is Status.INVALID_ARGUMENT
            assert bad.value.message == (
                "INVALID_ARGUMENT: chain must be a chain name: lowercase letters, digits, "
                "'-' and '_', up to 63 (got 70000 characters)"
            )

        def invoke(*argv: str) -> Any:
            cli = [*("--sync-invoker", invoker.addr, "invoke", "here"), *argv]
            return CliRunner().invoke(app, cli)

        # The CLI runs its own event loop: in a thread of its own.
        done = await asyncio.to_thread(invoke, "--chain", "base", "--json")
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["value"]["node"] == BASE_ID
        refused = await asyncio.to_thread(invoke, "--chain", "polygon")
        assert refused.exit_code == 2, refused.output
        assert refused.stderr.splitlines()[0] == (
            "error: FAILED_PRECONDITION: this Sync Invoker does not serve chain 'polygon' "
            "(it serves: base, eth)"
        )
    finally:
        assert invoker.stop() == 0
    assert "Traceback" not in invoker.output()
