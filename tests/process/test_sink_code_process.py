"""The code that wrote a row, through real Workers and the real ``blockx`` command:
a Worker writes blocks with one version of a function, a Worker restarted with
another rewrites one of them (both number their code epoch 1), and ``blockx code``
shows each block's exact source, told apart by the module set's digest."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chain_rows import seed_chain
from processes import WorkerProcess, execute_result, run_to_end, serving

from blockx_chain.schema import TRANSFER_TOPIC
from blockx_proto import worker_v1
from blockx_server.etcd.local import EtcdServer

FIRST = """
def seen(row):
    return {"log_index": row["log_index"], "token": row["address"]}
"""
SECOND = """
def seen(row):
    # The second version: the token in lower case.
    return {"log_index": row["log_index"], "token": row["address"].lower()}
"""
HELPER = "SCALE = 10\n"


def _task(task_id: str, block: int) -> worker_v1.TaskInput:
    config = {
        "function": "seen",
        "table": "logs",
        "block": block,
        "where": {"topic0": TRANSFER_TOPIC},
    }
    return worker_v1.TaskInput(
        task_id=task_id,
        function_call_config=worker_v1.FunctionCallConfig(
            type="BlockTableCallConfig", config=json.dumps(config)
        ),
        result_handler=worker_v1.ResultHandler(
            type="BlockWriteResultHandler", config=json.dumps({"table": "seen"})
        ),
    )


async def _write(env: dict[str, str], log: Path, tasks: list[tuple[str, int]]) -> None:
    async with serving(WorkerProcess(env, log)) as (stub,):
        for task_id, block in tasks:
            final = await run_to_end(stub, _task(task_id, block), timeout=30)
            assert final.state is worker_v1.TaskState.SUCCEEDED, final
            assert execute_result(final).plugin_results[0].result


def _blockx(*argv: str) -> tuple[int, str]:
    done = subprocess.run(
        ["blockx", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout + done.stderr


def _code(sink_url: str, *argv: str) -> dict[str, Any]:
    status, output = _blockx("code", *argv, "--sink-db", sink_url, "--json")
    assert status == 0, output
    shown: dict[str, Any] = json.loads(output)
    return shown


async def test_blockx_code_shows_the_source_that_wrote_each_block(
    etcd_server: EtcdServer, unique_lane: Callable[..., str], tmp_path: Path
) -> None:
    chain_url = f"sqlite:///{tmp_path}/chain.db"
    sink_url = f"sqlite:///{tmp_path}/sink.db"
    await seed_chain(chain_url, 8)
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "writes.py").write_text(FIRST)
    (functions / "helpers.py").write_text(HELPER)
    env = {
        "ETCD_ENDPOINTS": etcd_server.endpoint,
        "FUNCTIONS_DIR": str(functions),
        "BLOCKDB_URL": chain_url,
        "SINK_DB_URL": sink_url,
        "WORKER_REGISTRY_PREFIX": unique_lane(),
    }
    await _write(env, tmp_path / "first.log", [("t-1", 5), ("t-2", 6)])
    (functions / "writes.py").write_text(SECOND)
    await _write(env, tmp_path / "second.log", [("t-3", 5)])

    rewritten, kept = _code(sink_url, "seen", "5"), _code(sink_url, "seen", "6")
    assert (rewritten["block"]["task_id"], kept["block"]["task_id"]) == ("t-3", "t-2")
    # Both Workers numbered their code epoch 1: the digest tells the code apart.
    assert rewritten["block"]["code_epoch"] == kept["block"]["code_epoch"] == 1
    assert rewritten["code"]["code_digest"] != kept["code"]["code_digest"]
    assert rewritten["code"]["sources"] == {"writes": SECOND, "helpers": HELPER}
    assert kept["code"]["sources"] == {"writes": FIRST, "helpers": HELPER}
    # By task and by digest, one module.
    assert _code(sink_url, "--task", "t-2")["code"]["code_digest"] == kept["code"]["code_digest"]
    one = _code(sink_url, "--digest", kept["code"]["code_digest"], "--module", "writes")
    assert one["code"]["sources"] == {"writes": FIRST}
    # For people: the task, the epoch, the digest and the source as written.
    status, output = _blockx("code", "seen", "5", "--sink-db", sink_url)
    assert status == 0, output
    assert "task t-3" in output
    assert "code epoch 1" in output
    assert rewritten["code"]["code_digest"] in output
    assert SECOND.strip() in output
    # A block nobody wrote: one line, exit 1.
    status, output = _blockx("code", "seen", "7", "--sink-db", sink_url)
    assert (status, "no block 7 of table 'seen'" in output) == (1, True)
