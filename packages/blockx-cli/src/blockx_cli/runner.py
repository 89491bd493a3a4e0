"""Running a command's coroutine: a BlockX error is one clear line and an exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import typer

from blockx_cli.output import EXIT_SERVICE, EXIT_USAGE, fail
from blockx_cli.waiting import WaitingLine
from blockx_client import (
    BlockxError,
    ConnectError,
    NoSlotError,
    SlotWaitTimeoutError,
    SubmitUncertainError,
    TaskFileError,
    UnavailableError,
    listen_to_placement,
)

T = TypeVar("T")

TASK_FILE_HINT = "see examples/tasks/hello_world.json for the format"


def hint_for(exc: BlockxError) -> str | None:
    if isinstance(exc, SubmitUncertainError):
        return (
            "the worker may have accepted the task: "
            f"`blockx get-result <task_id> --worker {exc.worker_addr}` tells"
        )
    if isinstance(exc, ConnectError):
        return "is the cluster running? `blockx dev up` starts one locally"
    if isinstance(exc, SlotWaitTimeoutError):
        return "`blockx why` shows each worker's eligibility and the reason"
    if isinstance(exc, NoSlotError):
        return "every worker is busy; try again later or wait longer (--deadline / --timeout)"
    if isinstance(exc, UnavailableError):
        return "the coordinator sees no live worker yet (is etcd up, is a worker registered?)"
    return None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command; a BlockX error is one clear line and exit code 3, never a traceback."""
    try:
        with listen_to_placement(WaitingLine()):
            return asyncio.run(coro)
    except TaskFileError as exc:
        fail(str(exc), EXIT_USAGE, hint=TASK_FILE_HINT)
    except BlockxError as exc:
        fail(exc.message, EXIT_SERVICE, hint=hint_for(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
