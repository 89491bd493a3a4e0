"""The smoke task of ``blockx-dev``: one task through the Coordinator, with the client.

ReserveWorkerSlot → SubmitTask(slot_id) → WatchTasks to the terminal update, each
step printed, so a newcomer sees the path of one submission.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Final

from msgspec.structs import replace

from blockx_client import Client, RetryPolicy, TaskUpdate, load_task_file

# The Coordinator may not have seen the Worker's first heartbeat yet: keep asking,
# whatever the answer, until this deadline.
RESERVE_DEADLINE_S: Final = 30.0
_PATIENT: Final = RetryPolicy(unavailable_attempts=1_000_000)


async def run_smoke_task(coordinator: str, task_file: Path) -> str:
    """Run the task in ``task_file`` under a fresh task_id; returns how it ended."""
    task = replace(load_task_file(task_file), task_id=f"smoke-{uuid.uuid4()}")
    # Direct: a PROXY_SOCKET_PATH the shell kept from an earlier cluster names
    # another proxy, and this cluster's may not have listed its Worker yet.
    async with Client(coordinator=coordinator, retry=_PATIENT, direct=True) as client:
        slot = await client.reserve_worker_slot(task.task_id, deadline_s=RESERVE_DEADLINE_S)
        print(f"  reserved  slot {slot.slot_id} on worker {slot.worker_addr}", flush=True)
        submitted = await client.submit_task(
            task, worker_addr=slot.worker_addr, slot_id=slot.slot_id
        )
        print(f"  submitted task {task.task_id}: {submitted.state.value}", flush=True)
        final: TaskUpdate | None = None
        async for update in client.watch_tasks([task.task_id], worker_addr=slot.worker_addr):
            final = update
    return describe(final)


def describe(update: TaskUpdate | None) -> str:
    if update is None:
        return "  terminal  (the Watch stream ended without an update)"
    lines = [f"  terminal  {update.state.value}"]
    result = update.result
    if result is not None:
        if result.failure_code:
            lines.append(
                f"  failure   {result.failure_code} (retryable={result.retryable}): "
                f"{result.failure_message}"
            )
        for plugin in result.plugin_results:
            lines.append(f"  {plugin.plugin_name}: {plugin.result.decode(errors='replace')}")
    return "\n".join(lines)
