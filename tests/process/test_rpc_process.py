"""Functions reading ``io.rpc`` in the real ``blockx-worker`` and ``blockx-syncinvoker``
(CHAIN_RPC_URL pointing at a real anvil): reads at the exact block a hash names, a
write refused WRITE_FORBIDDEN even when the function catches the IoError, NOT_FOUND
reaching the function, and a malformed CHAIN_RPC_URL refusing start-up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from grpclib.client import Channel
from processes import (
    EXAMPLES,
    SyncInvokerProcess,
    WorkerProcess,
    call_list_task,
    execute_result,
    run_to_end,
)
from support import free_port

from blockx_chain.devnet import Anvil, Devnet
from blockx_chain.rpc import JsonRpcClient
from blockx_proto import syncinvoker_v1 as si
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FRESH = "0x000000000000000000000000000000000000f00d"

FUNCTIONS = """
from blockx_executor import IoError, io


async def balance_at(address, block):
    return await io.rpc.balance(address, block)


async def head():
    return {"chain_id": await io.rpc.chain_id(), "number": await io.rpc.block_number()}


async def token_code_size(token, block):
    code = await io.rpc.code(token, block)
    return (len(code) - 2) // 2


async def mines_and_swallows():
    try:
        await io.rpc.request("evm_mine", [])
    except IoError as exc:
        return "swallowed " + exc.kind
    return "mined"


async def sends():
    return await io.rpc.request("eth_sendTransaction", [{"from": "0x" + "00" * 20}])


async def missing_block(number):
    try:
        await io.rpc.block(number)
    except IoError as exc:
        return [exc.kind, exc.retryable]
    return "found"
"""


@dataclass(frozen=True)
class Chain:
    url: str
    token: str
    before_hash: str  # the block below the one that paid FRESH 777 wei
    paid_hash: str
    head: int


@pytest.fixture(scope="module")
def functions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rpc-functions")
    (folder / "chainfns.py").write_text(FUNCTIONS)
    return folder


_chains: dict[str, Chain] = {}


@pytest_asyncio.fixture
async def chain(anvil: Anvil) -> Chain:
    if anvil.url not in _chains:
        async with JsonRpcClient(anvil.url) as client:
            devnet = Devnet(client)
            await devnet.setup(tokens=1)
            before = (await devnet.mine(2))[-1]
            pay = {"from": devnet.accounts[5], "to": FRESH, "value": hex(777), "gas": "0x5208"}
            paid = await devnet.mine_block([pay])
            await devnet.mine(1)
            _chains[anvil.url] = Chain(
                anvil.url, devnet.tokens[0].address, before.hash, paid.hash, paid.number + 1
            )
    return _chains[anvil.url]


@pytest.fixture
def invoker(chain: Chain, functions_dir: Path, tmp_path: Path) -> Iterator[SyncInvokerProcess]:
    process = SyncInvokerProcess(
        {"CHAIN_RPC_URL": chain.url, "FUNCTIONS_DIR": str(functions_dir)},
        tmp_path / "syncinvoker.log",
    )
    yield process
    process.stop()


async def test_the_sync_invoker_reads_the_chain_and_refuses_writes(
    invoker: SyncInvokerProcess, chain: Chain
) -> None:
    await invoker.wait_ready()
    channel = invoker.channel()
    try:
        stub = si.SyncInvokerServiceStub(channel)

        async def invoke(function: str, *args: Any) -> si.InvokeResponse:
            request = si.InvokeRequest(function=function, args=json.dumps(args))
            return await stub.invoke(request, timeout=30)

        def result(response: si.InvokeResponse) -> Any:
            assert response.success, response.failure_message
            return json.loads(response.result)

        assert result(await invoke("head")) == {"chain_id": 31337, "number": chain.head}
        assert result(await invoke("balance_at", FRESH, chain.before_hash)) == "0"
        assert result(await invoke("balance_at", FRESH, chain.paid_hash)) == "777"
        assert result(await invoke("balance_at", FRESH, "latest")) == "777"
        assert result(await invoke("token_code_size", chain.token, chain.paid_hash)) > 100
        assert result(await invoke("missing_block", 1_000_000)) == ["NOT_FOUND", False]
        for function in ("mines_and_swallows", "sends"):
            refused = await invoke(function)
            assert not refused.success, function
            assert refused.failure_code == "WRITE_FORBIDDEN", function
            assert "io.rpc is read-only" in refused.failure_message
            assert not refused.retryable
        again = await invoke("head")
    finally:
        channel.close()
    # Nothing was mined by the refused writes.
    assert result(again) == {"chain_id": 31337, "number": chain.head}
    assert invoker.stop() == 0
    assert "Traceback" not in invoker.output()


async def test_a_worker_reads_the_chain_and_refuses_writes(
    chain: Chain,
    functions_dir: Path,
    etcd_server: EtcdServer,
    unique_lane: Callable[..., str],
    tmp_path: Path,
) -> None:
    worker = WorkerProcess(
        {
            "ETCD_ENDPOINTS": etcd_server.endpoint,
            "WORKER_REGISTRY_PREFIX": unique_lane(),
            "FUNCTIONS_DIR": str(functions_dir),
            "CHAIN_RPC_URL": chain.url,
        },
        tmp_path / "worker.log",
    )
    try:
        await worker.wait_ready()
        channel = Channel("127.0.0.1", worker.port)
        try:
            stub = worker_v1.WorkerServiceStub(channel)
            reads = await run_to_end(
                stub,
                call_list_task(
                    "t-rpc-reads",
                    "balance_at",
                    [[FRESH, chain.before_hash], [FRESH, chain.paid_hash], [FRESH, "latest"]],
                ),
            )
            assert reads.state is worker_v1.TaskState.SUCCEEDED
            plugin = execute_result(reads).plugin_results[0]
            assert json.loads(plugin.result) == ["0", "777", "777"]

            refused = await run_to_end(
                stub, call_list_task("t-rpc-write", "mines_and_swallows", [[]])
            )
            assert refused.state is worker_v1.TaskState.FAILED
            execute = execute_result(refused)
            assert execute.failure_code == "CALL_FAILED"
            assert "WRITE_FORBIDDEN" in execute.failure_message
            assert not execute.retryable
        finally:
            channel.close()
        assert worker.stop() == 0
        assert "Traceback" not in worker.output()
    finally:
        if worker.alive():
            worker.kill()


@pytest.mark.parametrize("program", ["blockx-syncinvoker", "blockx-worker"])
@pytest.mark.parametrize("url", ["localhost:8545", "ftp://node:8545", "http://:8545"])
def test_a_malformed_chain_rpc_url_refuses_start_up_in_one_line(program: str, url: str) -> None:
    binary = shutil.which(program)
    assert binary is not None
    done = subprocess.run(
        [binary],
        env={
            **os.environ,
            "FUNCTIONS_DIR": str(EXAMPLES / "functions"),
            "SYNC_INVOKER_LISTEN": f"127.0.0.1:{free_port()}",
            "WORKER_LISTEN": f"127.0.0.1:{free_port()}",
            "CHAIN_RPC_URL": url,
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "CHAIN_RPC_URL must be an http:// or https:// URL" in lines[0]
    assert url in lines[0]
