"""Options several commands take, declared once."""

from __future__ import annotations

from typing import Annotated, TypeVar

import typer

from blockx_cli.output import EXIT_USAGE, fail

T = TypeVar("T", str, list[str], None)


def task_id_option(ctx: typer.Context, param: typer.CallbackParam, value: T) -> T:
    """Typer callback: task ids a worker would accept (non-empty, bounded), or a usage
    error before anything is sent."""
    if ctx.resilient_parsing or value is None:
        return value
    from blockx_core.ids import task_id_problem

    option = param.opts[0] if param.param_type_name == "option" and param.opts else None
    for task_id in [value] if isinstance(value, str) else value:
        if not task_id:
            fail(
                f"{option or 'a task id'} is empty",
                EXIT_USAGE,
                hint="leave --task-id out to have one generated" if option else None,
            )
        problem = task_id_problem(task_id, option or "task_id")
        if problem is not None:
            fail(problem, EXIT_USAGE)
    return value


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
