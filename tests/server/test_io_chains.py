"""The router with several chains: a request reads its task's chain, the cache keys
the chain and keeps one epoch per chain, ``io.router.chain(name)`` reaches another
chain read-only, and every refusal names what is served; the task's chain from its
Builder config; the ``[chains.NAME]`` tables as the Worker's configuration reads
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blockx_core.chains import DEFAULT_CHAIN, Chain
from blockx_core.environ import EnvironOverFile
from blockx_server.io.chain_config import chain_in_file
from blockx_server.io.chain_io import ChainIo
from blockx_server.io.errors import IoFailed, IoOk, IoOutcome
from blockx_server.io.finality import StaticFinality
from blockx_server.io.router import IoRouter
from blockx_server.io.scope import TaskIoScope
from blockx_server.pipeline.task_chain import ChainRefused, task_chain
from blockx_server.runtime.config_file import ConfigFileError, read_config_file
from blockx_server.runtime.env import ConfigErrors
from blockx_server.worker.config import BLOCK_WORKER, load_worker_config


class Blocks:
    """A chain's block reads: ``block(n)`` answers the chain it belongs to, and is
    immutable at or below the finalized height."""

    name = "blockdb"
    read_ops = frozenset({"block"})
    write_ops = frozenset({"put"})

    def __init__(self, chain: str) -> None:
        self.chain = chain
        self.served = 0

    def immutable(
        self, op: str, args: list[Any], kwargs: dict[str, Any], finalized: int | None
    ) -> bool:
        return finalized is not None and int(args[0]) <= finalized

    async def serve(self, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.served += 1
        return {"chain": self.chain, "number": args[0]}


def two_chains() -> tuple[IoRouter, dict[str, Blocks], dict[str, StaticFinality]]:
    blocks = {name: Blocks(name) for name in ("eth", "base")}
    views = {name: StaticFinality(finalized=10, epoch=0) for name in blocks}
    chains = [
        ChainIo(Chain(name, chain_id), [blocks[name]], views[name])
        for name, chain_id in (("eth", 1), ("base", 8453))
    ]
    return IoRouter(chains=chains), blocks, views


def ok(outcome: IoOutcome) -> IoOk:
    assert isinstance(outcome, IoOk), outcome
    return outcome


async def test_each_chain_is_read_and_cached_apart() -> None:
    router, blocks, views = two_chains()
    eth = TaskIoScope(router, "t-eth", chain="eth")
    base = TaskIoScope(router, "t-base", chain="base")
    assert ok(await eth.request("blockdb", "block", [5])).decoded()["chain"] == "eth"
    assert ok(await base.request("blockdb", "block", [5])).decoded()["chain"] == "base"
    across = await eth.request("router", "chain", ["base", "blockdb", "block", 5])
    assert isinstance(across, IoOk), across
    assert across.cached
    assert across.decoded() == {"chain": "base", "number": 5}
    assert (blocks["eth"].served, blocks["base"].served) == (1, 1)
    # A reorganisation of base (a new epoch) drops base's answers only.
    views["base"].epoch = 1
    assert not ok(await base.request("blockdb", "block", [5])).cached
    assert ok(await eth.request("blockdb", "block", [5])).cached
    assert (blocks["eth"].served, blocks["base"].served) == (1, 2)


async def test_refusals_name_the_chains_served() -> None:
    router, _, _ = two_chains()
    scope = TaskIoScope(router, "t", chain="eth")
    unknown = await scope.request("router", "chain", ["polygon", "blockdb", "block", 1])
    assert isinstance(unknown, IoFailed), unknown
    assert (unknown.kind, unknown.retryable) == ("UNKNOWN_CHAIN", False)
    assert unknown.message == "no chain 'polygon': this process serves base, eth"
    write = await TaskIoScope(router, "t-w", chain="eth", writes=True).request(
        "router", "chain", ["base", "blockdb", "put", 1]
    )
    assert isinstance(write, IoFailed), write
    assert write.kind == "WRITE_FORBIDDEN"
    memory = await scope.request("router", "chain", ["base", "memory", "get", "k"])
    assert isinstance(memory, IoFailed), memory
    assert memory.message == "chain 'base' has no IO backend 'memory' (it has: blockdb)"
    unnamed = await TaskIoScope(router, "t-none").request("blockdb", "block", [1])
    assert isinstance(unnamed, IoFailed), unnamed
    assert unnamed.kind == "UNKNOWN_CHAIN"
    assert "this process serves several (base, eth)" in unnamed.message
    rpc = await scope.request("rpc", "chain_id", [])
    assert isinstance(rpc, IoFailed), rpc
    assert rpc.kind == "UNKNOWN_BACKEND"
    assert rpc.message.endswith("give [chains.eth] a rpc_url to enable it")


def test_a_task_reads_the_chain_its_builder_config_names() -> None:
    eth, base = Chain("eth", 1), Chain("base", 8453)
    assert task_chain('{"function": "f", "chain": "base"}', [eth, base]) == base
    assert task_chain('{"function": "f"}', [eth]) == eth
    assert task_chain('{"function": "f"}', []) is None
    with pytest.raises(ChainRefused, match=r"must name one \("):
        task_chain('{"function": "f"}', [eth, base])
    with pytest.raises(ChainRefused, match=r"does not serve chain 'op' \(it serves: base, eth\)"):
        task_chain('{"chain": "op"}', [eth, base])
    with pytest.raises(ChainRefused, match="is a chain's name"):
        task_chain('{"chain": 10}', [eth])


def test_the_worker_reads_chain_tables_or_the_shorthand(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(
        f'ETCD_ENDPOINTS = "127.0.0.1:2379"\nFUNCTIONS_DIR = "{tmp_path}"\n'
        '[chains.eth]\nchain_id = 1\nblockdb_url = "sqlite:////tmp/eth.db"\n'
        '[chains.base]\nchain_id = 8453\nrpc_url = "http://127.0.0.1:8545"\n'
    )
    file = read_config_file(config, ["ETCD_ENDPOINTS", "FUNCTIONS_DIR"], tables=("chains",))
    loaded = load_worker_config(BLOCK_WORKER, EnvironOverFile({}, file))
    by_name = {c.name: c for c in loaded.chains}
    assert (by_name["eth"].chain_id, by_name["base"].chain_id) == (1, 8453)
    assert by_name["eth"].rpc is None
    assert by_name["base"].blockdb is None
    shorthand = load_worker_config(
        BLOCK_WORKER,
        {
            "ETCD_ENDPOINTS": "127.0.0.1:2379",
            "FUNCTIONS_DIR": str(tmp_path),
            "BLOCKDB_URL": "sqlite:////x.db",
        },
    )
    (default,) = shorthand.chains
    assert (default.name, default.chain_id, default.rpc) == (DEFAULT_CHAIN, None, None)
    with pytest.raises(ConfigErrors) as refused:
        load_worker_config(BLOCK_WORKER, EnvironOverFile({"CHAIN_RPC_URL": "http://n:1"}, file))
    assert [e.variable for e in refused.value.errors] == ["CHAIN_RPC_URL"]
    # What `blockx chain ingest --chain NAME --config FILE` reads: one table, checked.
    assert chain_in_file(config, "base").chain_id == 8453
    with pytest.raises(ConfigFileError) as missing:
        chain_in_file(config, "polygon")
    assert missing.value.lines == [
        f"{config} has no table [chains.polygon] (its chains: base, eth)"
    ]
    config.write_text('[chains.eth]\nchain_id = "one"\nrpc_url = "http://n:1"\n')
    with pytest.raises(ConfigFileError) as bad:
        chain_in_file(config, "eth")
    assert bad.value.lines == [f"{config}: chains.eth.chain_id must be an integer >= 1 (got 'one')"]
