"""What the local cluster serves: a functions directory, and optionally more.

Only the functions directory is needed: ``--functions DIR``, else the
``FUNCTIONS_DIR`` variable, else ``functions/`` of the examples directory
(``--examples``, by default ``examples`` in the current directory). From the
examples directory two files are used when they are there: ``memory_seed.json``
(the in-memory IO backend's rows, ``IO_MEMORY_SEED_FILE``) and
``tasks/hello_world.json``, the smoke task, which calls the example functions and
so runs only when those are the functions served.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import msgspec

from blockx_cli.devcluster.processes import LaunchError

DEFAULT_EXAMPLES: Final = Path("examples")
SMOKE_TASK: Final = Path("tasks") / "hello_world.json"
MEMORY_SEED: Final = Path("memory_seed.json")


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    functions_dir: Path
    memory_seed: Path | None = None
    smoke_task: Path | None = None


def find_layout(
    *,
    functions: Path | None = None,
    examples: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Layout:
    """The layout the flags and FUNCTIONS_DIR name; LaunchError saying what is missing."""
    env = os.environ if environ is None else environ
    examples_dir = (examples or DEFAULT_EXAMPLES).resolve()
    from_env = env.get("FUNCTIONS_DIR", "").strip()
    if functions is not None:
        functions_dir, named = functions, f"--functions {functions}"
    elif from_env:
        functions_dir, named = Path(from_env), f"FUNCTIONS_DIR={from_env}"
    else:
        functions_dir = examples_dir / "functions"
        if not functions_dir.is_dir():
            given = examples if examples is not None else DEFAULT_EXAMPLES
            raise LaunchError(
                f"no functions to serve: {given} has no functions/ directory; "
                "pass --functions DIR (or set FUNCTIONS_DIR), or run from the repository root"
            )
        named = str(functions_dir)
    functions_dir = functions_dir.resolve()
    if not functions_dir.is_dir():
        raise LaunchError(f"{named} is not a directory")
    seed = examples_dir / MEMORY_SEED
    smoke = examples_dir / SMOKE_TASK
    serves_examples = functions_dir == examples_dir / "functions"
    return Layout(
        functions_dir=functions_dir,
        memory_seed=seed if seed.is_file() else None,
        smoke_task=smoke if serves_examples and smoke.is_file() else None,
    )
