"""Running a command's coroutine: a BlockX error is one clear line and an exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import typer

from blockx_cli.launch import collect_cycles
from blockx_cli.output import EXIT_SERVICE, EXIT_USAGE, fail
from blockx_cli.settings import CURRENT, FLAGS
from blockx_cli.waiting import WaitingLine
from blockx_client import (
    BlockxError,
    ChainNotServedError,
    ConnectError,
    InvalidRequestError,
    NoSlotError,
    SlotWaitTimeoutError,
    SubmitUncertainError,
    TaskFileError,
    UnavailableError,
    listen_to_placement,
)
from blockx_client.dev_config import LayeredEnviron
from blockx_client.setting import Origin

T = TypeVar("T")

_NOT_RUNNING = "is the cluster running? `blockx dev up` starts one locally"

TASK_FILE_HINT = "see examples/tasks/hello_world.json for the format"


def hint_for(exc: BlockxError) -> str | None:
    if isinstance(exc, SubmitUncertainError):
        return (
            "the worker may have accepted the task: "
            f"`blockx get-result <task_id> --worker {exc.worker_addr}` tells"
        )
    if isinstance(exc, ConnectError):
        return connect_hint(exc)
    if isinstance(exc, SlotWaitTimeoutError):
        return "`blockx why` shows each worker's eligibility and the reason"
    if isinstance(exc, NoSlotError):
        return "every worker is busy; try again later or wait longer (--deadline / --timeout)"
    if isinstance(exc, UnavailableError):
        return "the coordinator sees no live worker yet (is etcd up, is a worker registered?)"
    return None


def connect_hint(exc: ConnectError) -> str:
    """Where the address that could not be reached came from, when this command
    was given it (a flag, or its variable; the client's message names dev.toml or
    the default itself), and the exports that hide the running ``blockx dev up``."""
    said = None
    setting = exc.setting
    settings = CURRENT.get()
    if setting is not None and setting.origin is Origin.GIVEN and settings is not None:
        given = settings.given_setting(setting.variable)
        if given is not None:
            said = f"{given.value} is {given.origin_text(FLAGS[setting.variable])}"
            if given.dev_value is None:  # no running dev up to point at
                said += f"; {_NOT_RUNNING}"
    try:
        hidden = LayeredEnviron().overridden()
    except InvalidRequestError:
        hidden = []
    others = [name for name in hidden if setting is None or name != setting.variable]
    if said is None and hidden:
        return (
            f"the environment overrides dev.toml's {', '.join(hidden)}: "
            f"`unset {' '.join(hidden)}` to use the running `blockx dev up`"
        )
    if said is not None and others:
        return f"{said} The environment also overrides dev.toml's {', '.join(others)}."
    return said or _NOT_RUNNING


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command; a BlockX error is one clear line and exit code 3, never a traceback."""
    collect_cycles()
    try:
        with listen_to_placement(WaitingLine()):
            return asyncio.run(coro)
    except TaskFileError as exc:
        fail(str(exc), EXIT_USAGE, hint=TASK_FILE_HINT)
    except ChainNotServedError as exc:
        fail(exc.message, EXIT_USAGE, hint="pass --chain with one of the chains it serves")
    except BlockxError as exc:
        fail(exc.message, EXIT_SERVICE, hint=hint_for(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
